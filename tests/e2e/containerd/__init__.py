"""containerd 1.7 driven through the CRI exactly as the kubelet drives it, to prove CDI injection.

Debian 13's containerd is unpacked privately (never through the system's apt sources), started
on a private config built from ``deploy/containerd``, and spoken to over a reduced runtime.v1
CRI proto (``proto/cri``). Everything it creates on the host is removed again.
"""
