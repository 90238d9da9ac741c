"""cdi-gen: udev device classes → CDI specs → the kubelet, as device plugins or a DRA driver.

The package is grouped by what it does, and ``make lint`` checks its shape
(``.importlinter``): ``cli`` on top, then ``agent``, ``doctor`` and the admission webhook
``admission``; the two features ``deviceplugin`` and ``dra`` (independent of each other); what
both use to reach the outside (``kubelet``, ``apiserver``, ``sources``, ``devcgroup`` for a
container's device cgroup and ``containernode`` for a device node inside it); the pure
``discovery``, ``config`` and ``model``; the CDI core ``cdi``; ``retry``; and the base
(``names``, ``paths``, ``files``, ``modes``, ``logs``, ``inotify``, ``metrics``, ``errors``).
CONTRIBUTING.md maps every module.
"""

__version__ = "0.1.0"
