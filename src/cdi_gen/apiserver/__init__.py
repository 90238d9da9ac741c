"""The API-server side of the DRA driver: the node's ResourceSlices, the claims it prepares,
and the DeviceClasses that select its devices; and, for every agent, whether its exit is an
uninstall (:mod:`~cdi_gen.apiserver.uninstall`).

The only package that talks to the Kubernetes API server, and the only lightkube user.
:mod:`~cdi_gen.apiserver.slices` and :mod:`~cdi_gen.apiserver.deviceclasses` are pure (plain
dicts, no lightkube); :mod:`~cdi_gen.apiserver.client` and
:mod:`~cdi_gen.apiserver.publisher` load lightkube, so the agent imports them only when a class
is served through DRA (a device-plugin-only agent does not pay for the client), and
:mod:`~cdi_gen.apiserver.uninstall` loads the client only at exit, when a DaemonSet is named.
"""
