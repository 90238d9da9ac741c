"""The API server's configuration: an explicit kubeconfig, the in-cluster service account,
``$KUBECONFIG`` or ``~/.kube/config``, loaded into lightkube's model.

lightkube supplies the model: kubeconfig and in-cluster configurations, TLS, and every
authentication scheme (tokens, token files re-read on 401, client certificates, exec
plugins). The kubeconfig and the files it names are read with the same bound as other
configs (:data:`~cdi_gen.files.CONFIG_MAX_BYTES`) before lightkube reads them, and a
configuration that cannot be loaded is one :class:`~cdi_gen.apiserver.errors.KubeConfigError`
naming what was tried.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from lightkube import ConfigError, KubeConfig
from lightkube.config.kubeconfig import DEFAULT_KUBECONFIG, SERVICE_ACCOUNT

from cdi_gen.apiserver.errors import KubeConfigError, first_line
from cdi_gen.cdi.codec import BOUND_ERROR, load_yaml
from cdi_gen.errors import quote
from cdi_gen.files import CONFIG_MAX_BYTES, FileRefused, read_required

__all__ = ["load_kubeconfig"]


def load_kubeconfig(kubeconfig: Path | None) -> KubeConfig:
    """An explicit kubeconfig; else the in-cluster service account; else ``$KUBECONFIG`` or
    ``~/.kube/config``. Raises :class:`KubeConfigError` naming what was tried. Reads files:
    call it off the event loop."""
    if kubeconfig is not None:
        return _from_file(kubeconfig, f"--kubeconfig {str(kubeconfig)!r}")
    account = Path(SERVICE_ACCOUNT)
    in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and "KUBERNETES_SERVICE_PORT" in (
        os.environ
    )
    if in_cluster and (account / "token").is_file():
        what = f"in-cluster config from {account}"
        for name in ("token", "namespace", "ca.crt"):
            _check_file(account / name, what)
        try:
            return KubeConfig.from_service_account(account)
        except (ConfigError, OSError, KeyError, ValueError) as exc:
            raise KubeConfigError(f"{what}: {first_line(exc)}") from None
    env = os.environ.get("KUBERNETES_SERVICE_HOST")
    tried = (
        f"not in a cluster ({account}/token missing)"
        if env
        else "not in a cluster (KUBERNETES_SERVICE_HOST unset)"
    )
    if os.environ.get("KUBECONFIG"):
        path = Path(os.environ["KUBECONFIG"])
        return _from_file(path, f"{tried}; $KUBECONFIG {str(path)!r}")
    path = Path(DEFAULT_KUBECONFIG).expanduser()
    return _from_file(path, f"{tried}; $KUBECONFIG unset; {str(path)!r}")


def _check_file(path: str | Path, what: str) -> bytes:
    """A file the configuration needs, read within the config bound (lightkube and OpenSSL
    read it again by name; this refuses a FIFO, a device or a huge file first)."""
    try:
        return read_required(path, CONFIG_MAX_BYTES)
    except FileRefused as exc:
        raise KubeConfigError(f"{what}: {str(path)!r}: {exc}") from None


def _from_file(path: Path, what: str) -> KubeConfig:
    if not path.exists():
        raise KubeConfigError(f"no API server configuration: {what}: no such file")
    data = _check_file(path, what)
    try:
        # Bounded (nesting, alias expansion): a config bomb costs no more than its bytes.
        loaded = load_yaml(data)
        if not isinstance(loaded, dict):
            raise ValueError(f"not a mapping but {quote(loaded)}")
        kubeconfig = KubeConfig.from_dict(loaded, fname=path)
        config = kubeconfig.get()
        if config is None:
            raise ValueError("no current context")
    except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KubeConfigError(f"{what}: not a usable kubeconfig: {first_line(exc)}") from None
    except yaml.YAMLError as exc:
        # Never the parser's text: it quotes the file, which may be any file we can read.
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1} column {mark.column + 1})" if mark else ""
        if getattr(exc, BOUND_ERROR, False):
            where += f": {getattr(exc, 'problem', '')}"
        raise KubeConfigError(f"{what}: not a usable kubeconfig: not YAML{where}") from None
    user = config.user
    named = [config.cluster.certificate_auth]
    if user is not None:
        named += [user.client_cert, user.client_key, user.token_file]
    for name in named:
        if name:
            _check_file(Path(config.abs_file(name)), what)
    return kubeconfig
