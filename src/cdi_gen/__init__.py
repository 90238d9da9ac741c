"""cdi-gen: udev device classes → CDI specs → kubelet device plugins.

The package is layered: plain data and pure functions at the core (``names``, ``spec``,
``version``, ``codec``, ``registry``, ``discovery``), one adapter per outside system
(``udev`` for pyudev, ``plugin`` for gRPC, ``writer`` for the spec folder), and the
``agent``/``cli`` on top.
"""

__version__ = "0.1.0"
