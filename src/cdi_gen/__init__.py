"""cdi-gen: udev device classes → CDI specs → kubelet device plugins.

The package is layered, and ``make lint`` checks it (``.importlinter``): ``cli`` on top, then
``agent`` and ``doctor``, the adapters ``kubelet`` (grpc), ``sources`` (pyudev) and
``metrics``, pure ``discovery``, ``config`` and ``model``, the CDI core ``cdi``, and the base
(``names``, ``paths``, ``files``, ``modes``, ``logs``, ``backoff``, ``errors``).
CONTRIBUTING.md maps every module.
"""

__version__ = "0.1.0"
