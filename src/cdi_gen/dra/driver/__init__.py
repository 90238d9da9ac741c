"""cdi-gen's own DRA driver: what a claim gets and how it is prepared.

* :mod:`~cdi_gen.dra.driver.poolentries`: the pool's entries, from the class config and
  udev; :mod:`~cdi_gen.dra.driver.heldparts`, the parts of composite groups kept while a
  prepared claim holds them;
* :mod:`~cdi_gen.dra.driver.preparer`: the driver part behind the generic one's interface:
  which claims are prepared, and the decisions;
* :mod:`~cdi_gen.dra.driver.claimcheck`: what a claim gets (pure checks), and
  :mod:`~cdi_gen.dra.driver.refusal`, why not;
* :mod:`~cdi_gen.dra.driver.checkpoint`: the prepared claims on disk, the one store;
* :mod:`~cdi_gen.dra.driver.preparedclaim`: a prepared claim and its JSON form;
* :mod:`~cdi_gen.dra.driver.boot`: the boot they were prepared in (a reboot voids them);
* :mod:`~cdi_gen.dra.driver.statelock`: the lock two instances (a rolling update) share that
  state under;
* :mod:`~cdi_gen.dra.driver.claimconfig`: a claim's opaque configuration;
* :mod:`~cdi_gen.dra.driver.claimspec` and :mod:`~cdi_gen.dra.driver.claimfiles`: per-claim
  CDI specs, built and written;
  :mod:`~cdi_gen.dra.driver.claimsweep`: the claims' files set against the prepared claims at
  start;
* :mod:`~cdi_gen.dra.driver.devicemetadata` and :mod:`~cdi_gen.dra.driver.metadatafiles`:
  device metadata for the pod, built and written;
* :mod:`~cdi_gen.dra.driver.netdata`: a network interface's data in its claim's status;
* :mod:`~cdi_gen.dra.driver.deviceclasses`: the DeviceClasses of the configured classes.

The admission webhook that checks claims' configuration at ``kubectl apply`` is a package of
its own, :mod:`cdi_gen.admission`.
"""
