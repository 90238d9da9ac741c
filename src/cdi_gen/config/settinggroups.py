"""The groups of a run's settings, one model per concern: paths, the kubelet, the container
runtimes, DRA, the cluster, metrics, logs, retry.

Each group validates its own fields (as a flag or a ``CDI_GEN_*`` variable gives them, or as
defaults, which are validated too); :class:`~cdi_gen.config.settings.Settings` holds one of
each and maps every setting's flat name, the one its flag and variable carry, to its group.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cdi_gen import paths
from cdi_gen.cdi.registry import unique_dirs
from cdi_gen.errors import InvalidNameError, quote
from cdi_gen.names import is_dns_label, is_dns_subdomain, validate_driver_name
from cdi_gen.retry import FLOOR_SECONDS

__all__ = [
    "EMPTY",
    "NODE_NAME_RULE",
    "ClusterSettings",
    "DraSettings",
    "KubeletSettings",
    "LogSettings",
    "MetricsSettings",
    "PathSettings",
    "RetrySettings",
    "RuntimeSettings",
    "dns_subdomain",
    "not_empty",
    "parse_address",
]

#: Longest ``retry_max_seconds`` accepted.
RETRY_MAX_LIMIT = 3600.0
#: The message of an empty value, which the settings' error lines turn into a sentence.
EMPTY = "empty"
#: A Kubernetes Node name (the API server's ValidateNodeName). The DRA pool and every
#: ResourceSlice's ``nodeName`` are this name, so with any other the API server refuses each
#: slice and the publisher retries for ever: refused before the driver starts instead.
NODE_NAME_RULE = (
    "a DNS subdomain: at most 253 characters of lower-case letters, digits, '-' and '.', "
    "each dot-separated part starting and ending with a letter or digit"
)


#: A pod UID as the API server makes them (an RFC 4122 UUID) or as a test gives one: it names
#: the DRA sockets of this agent, so only characters a file name takes as they are.
POD_UID_RULE = "1 to 128 letters, digits, '-' and '_'"
POD_UID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _split(value: Any) -> Any:
    # Lists come from the environment space-separated (a manifest's value is one string).
    return tuple(value.split()) if isinstance(value, str) else value


class _Group(BaseModel):
    # Defaults are validated too, as given values are.
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def not_empty(value: Any) -> Any:
    """Refuse an empty value: an empty path or name in a manifest is a mistake, never "use
    the default"."""
    if value == "":
        raise ValueError(EMPTY)
    return value


def dns_subdomain(value: str | None) -> str | None:
    """Refuse a name that is not a DNS subdomain, quoting it."""
    if value is not None and not is_dns_subdomain(value):
        raise ValueError(
            f"{quote(value)} is not a DNS subdomain (lower-case letters, digits, '-' "
            "and '.', at most 253 characters)"
        )
    return value


class PathSettings(_Group):
    """Where the agent reads its config and writes its specs and state."""

    config: Path | None = Field(
        default=None,
        description="class config file (YAML or JSON); default: the embedded catalogue",
    )
    spec_dir: Path = Field(
        default=paths.DYNAMIC_SPEC_DIR,
        description="folder our spec files go to (/etc/cdi for static mode)",
    )
    runtime_spec_dirs: tuple[Path, ...] = Field(
        default=(),
        description="folders the container runtime reads, lowest priority first; Allocate "
        "checks names against them (default: /etc/cdi and the spec folder)",
    )
    state_dir: Path = Field(
        default=paths.STATE_DIR, description="cdi-gen's state (DRA's prepared claims)"
    )

    _words = field_validator("runtime_spec_dirs", mode="before")(_split)
    _present = field_validator("config", "spec_dir", "state_dir", mode="before")(not_empty)

    @field_validator("runtime_spec_dirs", mode="after")
    @classmethod
    def _unique(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        # A folder named twice would conflict with itself and fail every Allocate.
        return unique_dirs(value)

    def for_runtime(self) -> tuple[Path, ...]:
        """The folders Allocate checks names against, lowest priority first."""
        if self.runtime_spec_dirs:
            return self.runtime_spec_dirs
        if self.spec_dir == paths.STATIC_SPEC_DIR:
            return (self.spec_dir,)
        return (paths.STATIC_SPEC_DIR, self.spec_dir)


class KubeletSettings(_Group):
    """The kubelet's folders and sockets, and whether it is served at all."""

    device_plugin_dir: Path = Field(
        default=paths.DEVICE_PLUGIN_DIR, description="the kubelet's device plugin folder"
    )
    socket: Path | None = Field(
        default=None,
        description="the kubelet's registration socket (default: kubelet.sock in the device "
        "plugin folder)",
    )
    plugins_registry_dir: Path = Field(
        default=paths.PLUGINS_REGISTRY_DIR,
        description="the kubelet's plugin watcher folder (DRA registration socket)",
    )
    plugins_dir: Path = Field(
        default=paths.KUBELET_PLUGINS_DIR,
        description="the kubelet's plugin folder (DRA serves <driver>/dra.sock in it)",
    )
    pod_resources_socket: Path = Field(
        default=paths.POD_RESOURCES_SOCKET,
        description="the kubelet's pod-resources socket: which containers hold a device that "
        "came back (whenBack restart and follow)",
    )
    cdi_annotations: bool = Field(
        default=False,
        description="also answer Allocate with cdi.k8s.io/ annotations (containerd "
        "1.7.0/1.7.1, CRI-O < 1.28)",
    )
    disabled: bool = Field(
        default=False,
        description="host mode: keep the spec files current, serve no device plugin",
    )

    _present = field_validator(
        "device_plugin_dir",
        "socket",
        "plugins_registry_dir",
        "plugins_dir",
        "pod_resources_socket",
        mode="before",
    )(not_empty)

    @property
    def enabled(self) -> bool:
        """Whether to serve the kubelet (not host mode)."""
        return not self.disabled


class RuntimeSettings(_Group):
    """The node's container runtimes, and the cdiVersion pin they imply."""

    cdi_version: str | None = Field(
        default=None,
        description="pin cdiVersion for classes without a pin of their own: X.Y.Z, or "
        "'runtime' for the newest the node's container runtime reads",
    )
    refs: tuple[str, ...] = Field(
        default=(),
        description="the node's container runtime(s) as NAME@VERSION (containerd, cri-o, "
        "podman), for the 'runtime' pin and the doctor; default: every runtime on PATH, "
        "else the one answering on a CRI socket",
    )
    cri_sockets: tuple[Path, ...] = Field(
        default=paths.CRI_SOCKETS,
        description="CRI sockets asked for the runtime's name and version when no runtime "
        "binary is on PATH (in a pod); the first present one is also where whenBack restart "
        "and follow find and stop a class's holding containers",
    )

    _words = field_validator("refs", "cri_sockets", mode="before")(_split)


class DraSettings(_Group):
    """The DRA driver's name, the node it publishes for and the pod it runs in."""

    driver: str | None = Field(
        default=None,
        description="DRA driver name, a DNS subdomain (default: the config's vendor)",
    )
    node_name: str | None = Field(
        default=None,
        description="this node's name in Kubernetes (DRA's pool and slices); default: the "
        "host name, lower-cased and trimmed as the kubelet does",
    )

    pod_uid: str | None = Field(
        default=None,
        description="this agent's pod UID (the downward API's metadata.uid): with it the DRA "
        "sockets are named after it (<driver>-<uid>-reg.sock, dra-<uid>.sock), so that two "
        "agents of one driver serve side by side during a rolling update (kubelet >= 1.33); "
        "default: one agent per node (<driver>-reg.sock, dra.sock)",
    )

    _present = field_validator("driver", "node_name", "pod_uid", mode="before")(not_empty)

    @field_validator("pod_uid", mode="after")
    @classmethod
    def _pod_uid(cls, value: str | None) -> str | None:
        # It becomes part of two socket file names: nothing that could leave the folder.
        if value is not None and not POD_UID_PATTERN.fullmatch(value):
            raise ValueError(f"not a pod UID: {POD_UID_RULE}")
        return value

    @field_validator("driver", mode="after")
    @classmethod
    def _driver(cls, value: str | None) -> str | None:
        # Every ResourceSlice of a longer name gets 422: refuse it before starting.
        if value is not None:
            dns_subdomain(value)
            try:
                validate_driver_name(value)
            except InvalidNameError as exc:
                raise ValueError(f"not a DRA driver name: {exc.rule}") from None
        return value

    @field_validator("node_name", mode="after")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        # Refused in every mode: a name given on purpose that no Node can have is a mistake
        # in the manifest, whatever this run serves (the host name's default is judged only
        # where it is used, see Settings.node()).
        if value is not None and not is_dns_subdomain(value):
            raise ValueError(f"not a Kubernetes Node name: {NODE_NAME_RULE}")
        return value


class ClusterSettings(_Group):
    """The API server, and the DaemonSet whose uninstall the agent watches for at exit."""

    kubeconfig: Path | None = Field(
        default=None,
        description="kubeconfig for the API server (DRA); default: in-cluster, else "
        "$KUBECONFIG or ~/.kube/config",
    )
    daemonset: str | None = Field(
        default=None,
        description="the DaemonSet that runs this agent: at exit the agent asks the API server "
        "about it, and when it is gone or being deleted (an uninstall) removes its spec files "
        "and ResourceSlices; default: none, they are kept (a restart or an update needs them)",
    )
    daemonset_namespace: str | None = Field(
        default=None,
        description="the namespace of --daemonset; default: the service account's (in a pod), "
        "else the kubeconfig context's",
    )

    _present = field_validator("kubeconfig", "daemonset", "daemonset_namespace", mode="before")(
        not_empty
    )
    _name = field_validator("daemonset", mode="after")(dns_subdomain)

    @field_validator("daemonset_namespace", mode="after")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_label(value):
            raise ValueError(
                f"{quote(value)} is not a namespace: a DNS label (lower-case letters, digits "
                "and '-', at most 63 characters)"
            )
        return value


class MetricsSettings(_Group):
    """Where /metrics, /healthz and /readyz are served: an address, and a socket for probes."""

    address: str | None = Field(
        default=":9400",
        description="HOST:PORT of /metrics, /healthz and /readyz; empty to disable",
    )

    probe_socket: Path | None = Field(
        default=None,
        description="a unix socket, private to the pod, where /healthz and /readyz are served "
        "too: what `cdi-gen probe` asks (on the host's network a probe of the address may "
        "reach another agent, the one a rolling update replaces)",
    )

    _present = field_validator("probe_socket", mode="before")(not_empty)

    @field_validator("address", mode="after")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if not value:
            return None
        parse_address(value)
        return value


class LogSettings(_Group):
    """How the agent logs."""

    format: Literal["text", "json"] = Field(
        default="text", description="log lines as text, or each as one JSON object"
    )
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="the least severe level logged"
    )

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class RetrySettings(_Group):
    """How long the agent waits at most between two attempts of anything it retries."""

    #: Longest wait, in seconds, between two attempts of every retry loop of the agent (a
    #: class's spec write, a plugin's start, a kubelet registration, the DRA driver's start,
    #: the slice publisher's writes and restarts); from the floor of every backoff (0.1 s) to
    #: an hour, refused outside.
    max_seconds: float = Field(default=30.0, allow_inf_nan=False)

    @field_validator("max_seconds", mode="after")
    @classmethod
    def _retry_bounds(cls, value: float) -> float:
        # Below the floor the retries become a storm (1e-9 s made 46,765 attempts in 2 s);
        # above an hour a device waits that long after one passing write error.
        if not FLOOR_SECONDS <= value <= RETRY_MAX_LIMIT:
            raise ValueError(
                f"the longest wait between retries must be {FLOOR_SECONDS:g} to "
                f"{RETRY_MAX_LIMIT:g} seconds"
            )
        return value


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) → (host, port); raise ValueError."""
    host, sep, port = address.rpartition(":")
    # Port 0 asks the kernel for a free one (tests read it back from the listener).
    if not sep or not port.isdigit() or len(port) > 5 or int(port) > 65535:
        raise ValueError(
            f"invalid address {quote(address)}, should be HOST:PORT with a port of 0 to 65535"
        )
    return host.strip("[]") or "0.0.0.0", int(port)
