"""The settings of one run: command-line flags, ``CDI_GEN_*`` variables and defaults, grouped
by concern.

``cdi-gen run`` and ``cdi-gen doctor`` (which judges exactly what the agent would use) read
their settings here, nowhere else: a flag given on the command line wins, then the
environment variable named after the setting (``spec_dir`` ← ``CDI_GEN_SPEC_DIR``), then the
default. Each setting has one flat name, the grammar of its flag and variable (:data:`NAMES`);
inside the program it lives in a group (``settings.paths.spec_dir``, ``settings.retry.
max_seconds``): paths, kubelet, container runtimes, DRA, the cluster, metrics, logs, retry
(the group models are in :mod:`~cdi_gen.config.settinggroups`).
The class config file is one setting (``config``); :meth:`Settings.class_config` loads it
with every class's cdiVersion pin made concrete.

Errors name where the bad value came from, one line each: ``--spec-dir: an empty path is not
a folder`` for a flag, ``CDI_GEN_SPEC_DIR is set but empty: give a folder or unset it`` for a
variable (an empty variable is a mistake in a manifest, never "use the default").
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from cdi_gen.cdi.runtimes import Lookup
from cdi_gen.config.loader import load_config, pin_versions
from cdi_gen.config.models import AgentConfig, composite_refusal
from cdi_gen.config.settinggroups import (
    EMPTY,
    NODE_NAME_RULE,
    ClusterSettings,
    DraSettings,
    KubeletSettings,
    LogSettings,
    MetricsSettings,
    PathSettings,
    RetrySettings,
    RuntimeSettings,
    dns_subdomain,
    not_empty,
)
from cdi_gen.errors import ConfigError, InvalidNameError, quote
from cdi_gen.names import is_dns_subdomain, validate_driver_name
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
]

ENV_PREFIX = "CDI_GEN_"


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
    "pod_resources_socket": ("kubelet", "pod_resources_socket"),
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
    "probe_socket": ("metrics", "probe_socket"),
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

    _present = field_validator("instance", mode="before")(not_empty)
    _name = field_validator("instance", mode="after")(dns_subdomain)

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
        if self.api != "config":
            # The node's choice wins for every class, so one resource is never offered both
            # ways.
            classes = [c.model_copy(update={"api": self.api}) for c in config.classes]
            config = config.model_copy(update={"classes": classes})
        for i, c in enumerate(config.classes):
            if c.api != "dra" and c.group is not None and c.group.offer == "both":
                where = self.paths.config or "the embedded catalogue"
                raise ConfigError(
                    f"{where}: classes[{i}].group.offer: {composite_refusal(c.api)} "
                    f"(--api {self.api})"
                )
        return config

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
        if text == EMPTY:
            # A variable set but empty is said in a sentence of its own (below).
            return "an empty path is not a folder" if field(err["loc"]) in explicit else EMPTY
        return f"{text} (got {quote(str(err.get('input', '')))})"

    return [
        f"{p.path} is set but empty: give a folder or unset it" if p.message == EMPTY else str(p)
        for p in problems(exc, where=where, message=message)
    ]
