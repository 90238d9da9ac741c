"""The settings of one run: one model for command-line flags, ``CDI_GEN_*`` variables and defaults.

``cdi-gen run`` and ``cdi-gen doctor`` (which judges exactly what the agent would use) read
their settings here, nowhere else: a flag given on the command line wins, then the
environment variable named after the field (``spec_dir`` ← ``CDI_GEN_SPEC_DIR``), then the
default. The class config file is one setting (``config``); :meth:`Settings.class_config`
loads it with every class's cdiVersion pin made concrete.

Errors name where the bad value came from, one line each: ``--spec-dir: an empty path is not
a folder`` for a flag, ``CDI_GEN_SPEC_DIR is set but empty: give a folder or unset it`` for a
variable (an empty variable is a mistake in a manifest, never "use the default").
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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
    "NODE_NAME_RULE",
    "Settings",
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


def _split(value: Any) -> Any:
    # Lists come from the environment space-separated (a manifest's value is one string).
    return tuple(value.split()) if isinstance(value, str) else value


class Settings(BaseModel):
    """What a run of the agent takes besides the devices (see the module docstring)."""

    # Defaults are validated too, as given values are.
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

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
    device_plugin_dir: Path = Field(
        default=paths.DEVICE_PLUGIN_DIR, description="the kubelet's device plugin folder"
    )
    kubelet_socket: Path | None = Field(
        default=None,
        description="the kubelet's registration socket (default: kubelet.sock in the device "
        "plugin folder)",
    )
    udev_source: Literal["auto", "udev", "kernel"] | None = Field(
        default=None,
        description="netlink source; default: the config's (auto: udev when udevd runs)",
    )
    metrics_address: str | None = Field(
        default=":9400",
        description="HOST:PORT of /metrics, /healthz and /readyz; empty to disable",
    )
    cdi_annotations: bool = Field(
        default=False,
        description="also answer Allocate with cdi.k8s.io/ annotations (containerd "
        "1.7.0/1.7.1, CRI-O < 1.28)",
    )
    cleanup_on_exit: bool = Field(
        default=False,
        description="remove our spec files on exit (default: keep them for running pods)",
    )
    no_kubelet: bool = Field(
        default=False,
        description="host mode: keep the spec files current, serve no device plugin",
    )
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    cdi_version: str | None = Field(
        default=None,
        description="pin cdiVersion for classes without a pin of their own: X.Y.Z, or "
        "'runtime' for the newest the node's container runtime reads",
    )
    runtime: tuple[str, ...] = Field(
        default=(),
        description="the node's container runtime(s) as NAME@VERSION (containerd, cri-o, "
        "podman), for the 'runtime' pin and the doctor; default: every runtime on PATH, "
        "else the one answering on a CRI socket",
    )
    cri_socket: tuple[Path, ...] = Field(
        default=paths.CRI_SOCKETS,
        description="CRI sockets asked for the runtime's name and version when no runtime "
        "binary is on PATH (in a pod)",
    )
    api: Literal["config", "devicePlugin", "dra"] = Field(
        default="config",
        description="serve every class through a device plugin or DRA; 'config': each "
        "class's own 'api' (a node never offers one resource both ways)",
    )
    dra_driver: str | None = Field(
        default=None,
        description="DRA driver name, a DNS subdomain (default: the config's vendor)",
    )
    plugins_registry_dir: Path = Field(
        default=paths.PLUGINS_REGISTRY_DIR,
        description="the kubelet's plugin watcher folder (DRA registration socket)",
    )
    kubelet_plugins_dir: Path = Field(
        default=paths.KUBELET_PLUGINS_DIR,
        description="the kubelet's plugin folder (DRA serves <driver>/dra.sock in it)",
    )
    state_dir: Path = Field(
        default=paths.STATE_DIR, description="cdi-gen's state (DRA's prepared claims)"
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="kubeconfig for the API server (DRA); default: in-cluster, else "
        "$KUBECONFIG or ~/.kube/config",
    )
    node_name: str | None = Field(
        default=None,
        description="this node's name in Kubernetes (DRA's pool and slices); default: the "
        "host name, lower-cased and trimmed as the kubelet does",
    )
    instance: str | None = Field(
        default=None,
        description="this agent's name among cdi-gen agents sharing a spec folder: each "
        "replaces and removes only the specs it wrote; default: the config's vendor (two "
        "agents with one vendor need distinct names)",
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
    #: Longest wait, in seconds, between the attempts of every retry loop of the agent (a
    #: class's spec write or device plugin start, the DRA driver's start, the kubelet
    #: registrations, the DRA slice publisher's API retries and its restarts); from the floor
    #: of every backoff (0.1 s) to an hour, refused outside.
    retry_max_seconds: float = Field(default=30.0, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _environment(cls, data: Any) -> Any:
        # A field not given takes its CDI_GEN_ variable (name in any case), a string the
        # field's validators parse as they parse a flag's. Read here, not through
        # pydantic-settings: importing that cost the agent about 2.2 MiB (every settings
        # source it knows, measured with benchmarks/run.py --only footprint).
        if not isinstance(data, Mapping):
            return data
        env = {k.upper(): v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
        given = dict(data)
        for field in cls.model_fields:
            value = env.get(ENV_PREFIX + field.upper())
            if field not in given and value is not None:
                given[field] = value
        return given

    @field_validator("runtime_spec_dirs", "runtime", "cri_socket", mode="before")
    @classmethod
    def _words(cls, value: Any) -> Any:
        return _split(value)

    @field_validator(
        "config",
        "spec_dir",
        "device_plugin_dir",
        "kubelet_socket",
        "plugins_registry_dir",
        "kubelet_plugins_dir",
        "state_dir",
        "kubeconfig",
        "dra_driver",
        "node_name",
        "instance",
        "daemonset",
        "daemonset_namespace",
        mode="before",
    )
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if value == "":
            raise ValueError(_EMPTY)
        return value

    @field_validator("dra_driver", "instance", "daemonset", mode="after")
    @classmethod
    def _subdomain(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_subdomain(value):
            raise ValueError(
                f"{quote(value)} is not a DNS subdomain (lower-case letters, digits, '-' "
                "and '.', at most 253 characters)"
            )
        return value

    @field_validator("node_name", mode="after")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        # Refused in every mode: a name given on purpose that no Node can have is a mistake
        # in the manifest, whatever this run serves (the host name's default is judged only
        # where it is used, see node()).
        if value is not None and not is_dns_subdomain(value):
            raise ValueError(f"not a Kubernetes Node name: {NODE_NAME_RULE}")
        return value

    @field_validator("daemonset_namespace", mode="after")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_label(value):
            raise ValueError(
                f"{quote(value)} is not a namespace: a DNS label (lower-case letters, digits "
                "and '-', at most 63 characters)"
            )
        return value

    @field_validator("retry_max_seconds", mode="after")
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

    @field_validator("dra_driver", mode="after")
    @classmethod
    def _driver(cls, value: str | None) -> str | None:
        # Every ResourceSlice of a longer name gets 422: refuse it before starting.
        if value is not None:
            try:
                validate_driver_name(value)
            except InvalidNameError as exc:
                raise ValueError(f"not a DRA driver name: {exc.rule}") from None
        return value

    @field_validator("runtime_spec_dirs", mode="after")
    @classmethod
    def _unique(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        # A folder named twice would conflict with itself and fail every Allocate.
        return unique_dirs(value)

    @field_validator("metrics_address", mode="after")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if not value:
            return None
        parse_address(value)
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @property
    def kubelet(self) -> bool:
        """Whether to serve device plugins (not host mode)."""
        return not self.no_kubelet

    def class_config(self, fallback: Lookup | None = None) -> AgentConfig:
        """The class config file (or the embedded catalogue) with every class's cdiVersion
        pin concrete; ``runtime`` is resolved once, now (the runtime does not change under a
        running agent), by ``fallback`` (the caller's CRI lookup) when no runtime binary
        answers. Raises :class:`ConfigError` (exit 2)."""
        config = pin_versions(
            load_config(self.config), self.cdi_version, self.runtime, fallback=fallback
        )
        if self.api == "config":
            return config
        # The node's choice wins for every class, so one resource is never offered both ways.
        classes = [c.model_copy(update={"api": self.api}) for c in config.classes]
        return config.model_copy(update={"classes": classes})

    def driver_name(self, config: AgentConfig) -> str:
        """The DRA driver name: ``--dra-driver``, else the config's vendor. Raises
        :class:`ConfigError` (exit 2) for a vendor too long to be a driver name."""
        if self.dra_driver:
            return self.dra_driver
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
        if self.node_name:
            return self.node_name
        host = socket.gethostname()
        node = host.strip().lower()
        if is_dns_subdomain(node):
            return node
        derived = "" if node == host else f" (lower-cased and trimmed: {quote(node)})"
        raise ConfigError(
            f"host name: {quote(host)}{derived} is not a Kubernetes Node name: "
            f"{NODE_NAME_RULE}; give the Node's name with --node-name ({ENV_PREFIX}NODE_NAME)"
        )

    def spec_dirs_for_runtime(self) -> tuple[Path, ...]:
        """The folders Allocate checks names against, lowest priority first."""
        if self.runtime_spec_dirs:
            return self.runtime_spec_dirs
        if self.spec_dir == paths.STATIC_SPEC_DIR:
            return (self.spec_dir,)
        return (paths.STATIC_SPEC_DIR, self.spec_dir)


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
        return str(loc[0]) if loc else ""

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
