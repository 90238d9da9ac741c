"""The Kubernetes API server as the agent needs it: the calls
(:mod:`~cdi_gen.apiserver.client`), the configuration they use
(:mod:`~cdi_gen.apiserver.kubeconfig`), the bounded, checked answers
(:mod:`~cdi_gen.apiserver.answers`, :mod:`~cdi_gen.apiserver.resourceclaim`), the Events
it records, deduplicated and rate-limited (:mod:`~cdi_gen.apiserver.events`), and the
failures (:mod:`~cdi_gen.apiserver.errors`).

The only package that talks to the API server, and the only lightkube user. It loads
lightkube, so the agent imports it only when a class is served through DRA (a
device-plugin-only agent does not pay for the client), or at exit when a DaemonSet is named.
"""
