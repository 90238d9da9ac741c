"""The Kubernetes API server as the agent needs it (:mod:`~cdi_gen.apiserver.client`).

The only package that talks to the API server, and the only lightkube user. It loads
lightkube, so the agent imports it only when a class is served through DRA (a
device-plugin-only agent does not pay for the client), or at exit when a DaemonSet is named.
"""
