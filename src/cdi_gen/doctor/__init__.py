"""``cdi-gen doctor``: preflight checks of a node, one line each with what to do.

The most expensive failure of a CDI-only device plugin is silent: containerd 1.7 ships with
``enable_cdi = false`` and then *ignores* the CDI names the kubelet passes, so pods start
without their devices. The doctor reads the runtime configs
(:mod:`~cdi_gen.doctor.runtimeconfigs`), the spec folders as a runtime would
(:mod:`~cdi_gen.doctor.specfolders`), the cdiVersion each runtime reads
(:mod:`~cdi_gen.doctor.runtimechecks`), the kubelet's sockets and the API server configuration
(:mod:`~cdi_gen.doctor.kubernetes`), udev and what the configured classes match
(:mod:`~cdi_gen.doctor.devices`), and says OK, WARN or FAIL with the fix
(:class:`~cdi_gen.doctor.check.Check`); :func:`~cdi_gen.doctor.diagnosis.diagnose` runs them
all in the order printed.
"""
