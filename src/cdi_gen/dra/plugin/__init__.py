"""The generic part of a DRA driver: what any driver needs, whatever its devices.

* :mod:`~cdi_gen.dra.plugin.server`: the kubelet plugin's sockets, registered through the
  plugin watcher, and the rolling-update handover (what an instance knows of the others:
  :mod:`~cdi_gen.dra.plugin.handover`);
* :mod:`~cdi_gen.dra.plugin.service`: its node service (``dra.v1``/``v1beta1``) and health
  stream (``drahealth``), on the server's threads;
* :mod:`~cdi_gen.dra.plugin.calls`: every prepare and unprepare around the driver part:
  claims read (:mod:`~cdi_gen.dra.plugin.claimreader`), held by UID
  (:mod:`~cdi_gen.dra.plugin.inflight`), handed to the driver part, and their status
  written (:mod:`~cdi_gen.dra.plugin.claimstatus`);
* :mod:`~cdi_gen.dra.plugin.claims`: what the generic part asks of a driver part (the
  ``ClaimPreparer`` interface, the ``ClaimReader`` protocol) and what it answers;
* :mod:`~cdi_gen.dra.plugin.pool`: the devices the driver publishes (its resources; the
  driver builds the entries);
* :mod:`~cdi_gen.dra.plugin.notices`: the claims holding a device that left or came back
  told so (a status condition, Events on their pods), and what the agent then did;
* :mod:`~cdi_gen.dra.plugin.offering`: the pool offered in the slices only while the plugin
  serves, the publisher started (and over), the rolling update's yield and take-back, the
  ordered close;
* :mod:`~cdi_gen.dra.plugin.slices`: the pool as ResourceSlice objects (plain dicts);
* :mod:`~cdi_gen.dra.plugin.capacity`: whether the API server serves consumable capacity
  (a shared device published once); :mod:`~cdi_gen.dra.plugin.counters`: whether it keeps
  shared counters (a composite group's whole beside its parts); both asked by
  :mod:`~cdi_gen.dra.plugin.dryrun`, a dry-run slice create;
* :mod:`~cdi_gen.dra.plugin.publisher`: the node's ResourceSlices kept equal to the pool;
  its watch of them (:mod:`~cdi_gen.dra.plugin.slicewatch`) and its writes of single slices
  (:mod:`~cdi_gen.dra.plugin.slicewriter`), with :mod:`~cdi_gen.dra.plugin.slicerecord`,
  what it keeps of each slice;
* :mod:`~cdi_gen.dra.plugin.uninstall`: whether an exit is an uninstall, and the slices then
  deleted.
"""
