"""Serving classes through the node's DRA driver (``resource.k8s.io``), one driver per node.

In two parts, modelled on the split of Kubernetes' helper library for DRA drivers but not yet
the same in every place:

* :mod:`cdi_gen.dra.plugin`, the generic part: the kubelet plugin's gRPC service and
  registration, the health stream, the node's ResourceSlices and their publishing (offered
  only while the plugin serves), and uninstall. It knows nothing of how a claim is prepared,
  nor of the class config or udev;
* :mod:`cdi_gen.dra.driver`, this driver's own part: the pool's entries, claim checks,
  prepare and unprepare, the checkpoint, opaque configuration, per-claim CDI specs, device
  metadata, DeviceClasses.

``.importlinter`` keeps the generic part from importing the driver's, and the whole package
independent of :mod:`cdi_gen.deviceplugin`.
"""
