"""The generic part of a DRA driver: what any driver needs, whatever its devices.

* :mod:`~cdi_gen.dra.plugin.server`: the kubelet plugin's node service (``dra.v1``/
  ``v1beta1``) and health stream (``drahealth``), registered through the plugin watcher;
* :mod:`~cdi_gen.dra.plugin.pool`: the devices the driver publishes (its resources);
* :mod:`~cdi_gen.dra.plugin.slices`: the pool as ResourceSlice objects (plain dicts);
* :mod:`~cdi_gen.dra.plugin.publisher`: the node's ResourceSlices kept equal to the pool;
* :mod:`~cdi_gen.dra.plugin.uninstall`: whether an exit is an uninstall, and the slices then
  deleted.
"""
