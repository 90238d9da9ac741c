"""Serving classes through the node's DRA driver (``resource.k8s.io``), one driver per node.

In two parts, in the shape of Kubernetes' helper library for DRA drivers, wired together by
:mod:`cdi_gen.dra.node` (the driver as the agent runs it):

* :mod:`cdi_gen.dra.plugin`, the generic part: the kubelet plugin's gRPC service and
  registration, the health stream, the node's ResourceSlices and their publishing (offered
  only while the plugin serves), and uninstall. It knows nothing of how a claim is prepared,
  nor of the class config or udev;
* :mod:`cdi_gen.dra.driver`, this driver's own part: the pool's entries, claim checks,
  prepare and unprepare behind the generic part's small interface
  (:class:`~cdi_gen.dra.plugin.claims.ClaimPreparer`), the checkpoint, opaque configuration,
  per-claim CDI specs, device metadata, DeviceClasses. It knows nothing of gRPC, the
  kubelet or the API server.

``.importlinter`` keeps the generic part from importing the driver's, the driver's part from
importing grpc, the kubelet and API-server adapters, and the whole package independent of
:mod:`cdi_gen.deviceplugin`.
"""
