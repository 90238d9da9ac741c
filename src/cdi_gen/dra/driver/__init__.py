"""cdi-gen's own DRA driver: what a claim gets and how it is prepared.

* :mod:`~cdi_gen.dra.driver.driver`: the driver as the agent runs it (pool, plugin, publisher),
  the frontend and pool of every DRA class;
* :mod:`~cdi_gen.dra.driver.preparer`: which claims are prepared, and the decisions;
* :mod:`~cdi_gen.dra.driver.claimcalls`: how the server threads share a claim's prepare (read
  before any lock) and its record;
* :mod:`~cdi_gen.dra.driver.claimcheck`: what a claim gets (pure checks);
* :mod:`~cdi_gen.dra.driver.checkpoint`: the prepared claims on disk, the one store;
* :mod:`~cdi_gen.dra.driver.preparedclaim`: a prepared claim and its JSON form;
* :mod:`~cdi_gen.dra.driver.boot`: the boot they were prepared in (a reboot voids them);
* :mod:`~cdi_gen.dra.driver.statelock`: the lock two instances (a rolling update) share that
  state under;
* :mod:`~cdi_gen.dra.driver.claimconfig`: a claim's opaque configuration;
* :mod:`~cdi_gen.dra.driver.claimspec` and :mod:`~cdi_gen.dra.driver.claimspecs`: per-claim
  CDI specs, built and written;
* :mod:`~cdi_gen.dra.driver.devicemetadata` and :mod:`~cdi_gen.dra.driver.metadatafiles`:
  device metadata for the pod, built and written;
* :mod:`~cdi_gen.dra.driver.claimstatus`: a prepared claim's devices in its status;
* :mod:`~cdi_gen.dra.driver.claimreader`: claims read from the API server;
* :mod:`~cdi_gen.dra.driver.deviceclasses`: the DeviceClasses of the configured classes;
* :mod:`~cdi_gen.dra.driver.admission`, :mod:`~cdi_gen.dra.driver.admissionserver` and
  :mod:`~cdi_gen.dra.driver.servingcert`: the admission webhook (``cdi-gen admission``): the
  check, its HTTPS server and its renewable certificate.
"""
