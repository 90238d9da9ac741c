"""The claims' admission webhook (``cdi-gen admission``): a ResourceClaim or
ResourceClaimTemplate whose opaque configuration for our DRA driver is not a valid
``DeviceConfig`` is refused at ``kubectl apply``, with the line the driver would give at
NodePrepareResources.

A process of its own (a Deployment, not the node agent): it serves the API server over TLS and
speaks to no kubelet, no API server and no udev.

* :mod:`~cdi_gen.admission.review`: an ``AdmissionReview`` answered (pure); the check is the
  driver's own parser, :mod:`cdi_gen.dra.driver.claimconfig`, the one module it takes from the
  driver;
* :mod:`~cdi_gen.admission.https`: the HTTPS server, its memory bounded whatever the clients
  do;
* :mod:`~cdi_gen.admission.certificate`: the serving certificate, taken up again when it is
  renewed.
"""
