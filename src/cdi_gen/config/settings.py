"""The settings of one run: command-line flags, ``CDI_GEN_*`` variables and defaults, grouped
by concern.

``cdi-gen run`` and ``cdi-gen doctor`` (which judges exactly what the agent would use) read
their settings here, nowhere else: a flag given on the command line wins, then the
environment variable named after the setting (``spec_dir`` ← ``CDI_GEN_SPEC_DIR``), then the
default. Each setting has one flat name, the grammar of its flag and variable (:data:`NAMES`);
inside the program it lives in a group (``settings.paths.spec_dir``, ``settings.retry.
max_seconds``): paths, kubelet, container runtimes, DRA, the cluster, metrics, logs, retry.
The class config file is one setting (``config``); :meth:`Settings.class_config` loads it
with every class's cdiVersion pin made concrete.

Errors name where the bad value came from, one line each: ``--spec-dir: an empty path is not
a folder`` for a flag, ``CDI_GEN_SPEC_DIR is set but empty: give a folder or unset it`` for a
variable (an empty variable is a mistake in a manifest, never "use the default").
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from cdi_gen import paths
from cdi_gen.cdi.registry import unique_dirs
from cdi_gen.cdi.runtimes import Lookup
from cdi_gen.config.loader import load_config, pin_versions
from cdi_gen.config.models import AgentConfig
from cdi_gen.errors import ConfigError, InvalidNameError, quote
from cdi_gen.names import is_dns_label, is_dns_subdomain, validate_driver_name
from cdi_gen.retry import FLOOR_SECONDS
from cdi_gen.strictmodel import Loc, problems

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

__all__ = [
    "ENV_PREFIX",
    "NAMES",
    "NODE_NAME_RULE",
    "Settings",
    "field_info",
    "load_settings",
    "parse_address",
]

ENV_PREFIX = "CDI_GEN_"
#: Longest ``retry_max_seconds`` accepted.
RETRY_MAX_LIMIT = 3600.0
_EMPTY = "empty"
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


def _not_empty(value: Any) -> Any:
    if value == "":
        raise ValueError(_EMPTY)
    return value


def _subdomain(value: str | None) -> str | None:
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
    _present = field_validator("config", "spec_dir", "state_dir", mode="before")(_not_empty)

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
        "device_plugin_dir", "socket", "plugins_registry_dir", "plugins_dir", mode="before"
    )(_not_empty)

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
        "binary is on PATH (in a pod)",
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

    _present = field_validator("driver", "node_name", "pod_uid", mode="before")(_not_empty)

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
            _subdomain(value)
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
        _not_empty
    )
    _name = field_validator("daemonset", mode="after")(_subdomain)

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
    """Where /metrics, /healthz and /readyz are served."""

    address: str | None = Field(
        default=":9400",
        description="HOST:PORT of /metrics, /healthz and /readyz; empty to disable",
    )

    @field_validator("address", mode="after")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if not value:
            return None
        parse_address(value)
        return value


class LogSettings(_Group):
    """How the agent logs."""

    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"

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


#: Every setting's flat name (its flag ``--spec-dir`` and variable ``CDI_GEN_SPEC_DIR``) →
#: its group and its name in the group (None: a field of :class:`Settings` itself).
NAMES: dict[str, tuple[str | None, str]] = {
    "config": ("paths", "config"),
    "spec_dir": ("paths", "spec_dir"),
    "runtime_spec_dirs": ("paths", "runtime_spec_dirs"),
    "state_dir": ("paths", "state_dir"),
    "device_plugin_dir": ("kubelet", "device_plugin_dir"),
    "kubelet_socket": ("kubelet", "socket"),
    "plugins_registry_dir": ("kubelet", "plugins_registry_dir"),
    "kubelet_plugins_dir": ("kubelet", "plugins_dir"),
    "cdi_annotations": ("kubelet", "cdi_annotations"),
    "no_kubelet": ("kubelet", "disabled"),
    "cdi_version": ("runtimes", "cdi_version"),
    "runtime": ("runtimes", "refs"),
    "cri_socket": ("runtimes", "cri_sockets"),
    "dra_driver": ("dra", "driver"),
    "node_name": ("dra", "node_name"),
    "pod_uid": ("dra", "pod_uid"),
    "kubeconfig": ("cluster", "kubeconfig"),
    "daemonset": ("cluster", "daemonset"),
    "daemonset_namespace": ("cluster", "daemonset_namespace"),
    "metrics_address": ("metrics", "address"),
    "log_format": ("logs", "format"),
    "log_level": ("logs", "level"),
    "retry_max_seconds": ("retry", "max_seconds"),
    "api": (None, "api"),
    "instance": (None, "instance"),
    "udev_source": (None, "udev_source"),
    "cleanup_on_exit": (None, "cleanup_on_exit"),
}
_FLAT = {place: name for name, place in NAMES.items()}


class Settings(BaseModel):
    """What a run of the agent takes besides the devices (see the module docstring).

    Built from flat names (``Settings(spec_dir=...)``, as flags and variables give them);
    read by group (``settings.paths.spec_dir``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    paths: PathSettings = Field(default_factory=PathSettings)
    kubelet: KubeletSettings = Field(default_factory=KubeletSettings)
    runtimes: RuntimeSettings = Field(default_factory=RuntimeSettings)
    dra: DraSettings = Field(default_factory=DraSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    logs: LogSettings = Field(default_factory=LogSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    api: Literal["config", "devicePlugin", "dra"] = Field(
        default="config",
        description="serve every class through a device plugin or DRA; 'config': each "
        "class's own 'api' (a node never offers one resource both ways)",
    )
    instance: str | None = Field(
        default=None,
        description="this agent's name among cdi-gen agents sharing a spec folder: each "
        "replaces and removes only the specs it wrote; default: the config's vendor (two "
        "agents with one vendor need distinct names)",
    )
    udev_source: Literal["auto", "udev", "kernel"] | None = Field(
        default=None,
        description="netlink source; default: the config's (auto: udev when udevd runs)",
    )
    cleanup_on_exit: bool = Field(
        default=False,
        description="remove our spec files on exit (default: keep them for running pods)",
    )

    _present = field_validator("instance", mode="before")(_not_empty)
    _name = field_validator("instance", mode="after")(_subdomain)

    @model_validator(mode="before")
    @classmethod
    def _grouped(cls, data: Any) -> Any:
        # Flat names in (the given ones, then a field not given takes its CDI_GEN_ variable,
        # name in any case, a string the field's validators parse as they parse a flag's);
        # groups out. Variables are read here, not through pydantic-settings: importing that
        # cost the agent about 2.2 MiB (every settings source it knows, measured with
        # benchmarks/run.py --only footprint).
        if not isinstance(data, Mapping):
            return data
        env = {k.upper(): v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
        given = dict(data)
        for name in NAMES:
            value = env.get(ENV_PREFIX + name.upper())
            if name not in given and value is not None:
                given[name] = value
        grouped: dict[str, Any] = {}
        for name, value in given.items():
            group, field = NAMES.get(name, (None, name))
            if group is None:
                grouped[field] = value
            else:
                grouped.setdefault(group, {})[field] = value
        return grouped

    def class_config(self, fallback: Lookup | None = None) -> AgentConfig:
        """The class config file (or the embedded catalogue) with every class's cdiVersion
        pin concrete; ``runtime`` is resolved once, now (the runtime does not change under a
        running agent), by ``fallback`` (the caller's CRI lookup) when no runtime binary
        answers. Raises :class:`ConfigError` (exit 2)."""
        runtimes = self.runtimes
        config = pin_versions(
            load_config(self.paths.config), runtimes.cdi_version, runtimes.refs, fallback=fallback
        )
        if self.api == "config":
            return config
        # The node's choice wins for every class, so one resource is never offered both ways.
        classes = [c.model_copy(update={"api": self.api}) for c in config.classes]
        return config.model_copy(update={"classes": classes})

    def driver_name(self, config: AgentConfig) -> str:
        """The DRA driver name: ``--dra-driver``, else the config's vendor. Raises
        :class:`ConfigError` (exit 2) for a vendor too long to be a driver name."""
        if self.dra.driver:
            return self.dra.driver
        try:
            validate_driver_name(config.vendor)
        except InvalidNameError as exc:
            raise ConfigError(
                f"vendor as the DRA driver name: {exc}; give --dra-driver "
                f"({ENV_PREFIX}DRA_DRIVER) or a shorter vendor"
            ) from None
        return config.vendor

    def node(self) -> str:
        """This node's name: ``--node-name``, else the host name lower-cased and trimmed (the
        kubelet's own default). Raises :class:`ConfigError` (exit 2) when the host name makes
        no Node name.

        Judged here, not when the settings load: only the DRA driver (its pool, slices and
        Node lookup) uses the node name, so an agent of device plugins starts on a host of
        any name.
        """
        if self.dra.node_name:
            return self.dra.node_name
        host = socket.gethostname()
        node = host.strip().lower()
        if is_dns_subdomain(node):
            return node
        derived = "" if node == host else f" (lower-cased and trimmed: {quote(node)})"
        raise ConfigError(
            f"host name: {quote(host)}{derived} is not a Kubernetes Node name: "
            f"{NODE_NAME_RULE}; give the Node's name with --node-name ({ENV_PREFIX}NODE_NAME)"
        )


def field_info(name: str) -> FieldInfo:
    """The field behind the setting of flat ``name`` (its description and default)."""
    group, field = NAMES[name]
    model = Settings if group is None else Settings.model_fields[group].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    return model.model_fields[field]


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) → (host, port); raise ValueError."""
    host, sep, port = address.rpartition(":")
    # Port 0 asks the kernel for a free one (tests read it back from the listener).
    if not sep or not port.isdigit() or len(port) > 5 or int(port) > 65535:
        raise ValueError(
            f"invalid address {quote(address)}, should be HOST:PORT with a port of 0 to 65535"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def load_settings(flags: Mapping[str, Any] | None = None, **given: Any) -> Settings:
    """Settings from ``flags`` (the command line: None or () for a flag not given), then the
    environment, then the defaults.

    Raises :class:`ConfigError` (exit 2) with one line per bad value, naming the flag or the
    variable it came from.
    """
    explicit = {k: v for k, v in {**(flags or {}), **given}.items() if v is not None and v != ()}
    try:
        return Settings(**explicit)
    except ValidationError as exc:
        raise ConfigError("\n".join(_lines(exc, explicit))) from None


def _lines(exc: ValidationError, explicit: Mapping[str, Any]) -> Sequence[str]:
    def field(loc: Loc) -> str:
        # A group's field is named by its flat name, the one its flag and variable carry.
        parts = tuple(str(part) for part in loc)
        if not parts:
            return ""
        place = (parts[0], parts[1]) if len(parts) > 1 else (None, parts[0])
        return _FLAT.get(place, parts[0])

    def where(loc: Loc) -> str:
        name = field(loc)
        return _flag(name) if name in explicit else ENV_PREFIX + name.upper()

    def message(err: ErrorDetails) -> str:
        text = str(err.get("ctx", {}).get("error", err["msg"]))
        if text == _EMPTY:
            # A variable set but empty is said in a sentence of its own (below).
            return "an empty path is not a folder" if field(err["loc"]) in explicit else _EMPTY
        return f"{text} (got {quote(str(err.get('input', '')))})"

    return [
        f"{p.path} is set but empty: give a folder or unset it" if p.message == _EMPTY else str(p)
        for p in problems(exc, where=where, message=message)
    ]
