"""Options several commands share: the ones that feed the settings model, and the inputs of
the discovery commands.

A settings option has no default and no environment variable of its own: it hands the flag,
if given, to :func:`~cdi_gen.config.settings.load_settings`, which applies the
``CDI_GEN_*`` variable and the default. Its help is the field's description, so the flag,
the variable and the docs say the same.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

#: Must match config.settings.ENV_PREFIX (test_settings checks each option's variable).
_ENV_PREFIX = "CDI_GEN_"
#: The settings fields the options below feed.
_FIELDS: set[str] = set()


class _SettingOption(click.Option):
    """An option whose help is the settings field's description, read when help is shown.

    Lazily: importing the settings model loads pydantic, and ``cdi-gen --help`` or
    ``render`` must not pay for it.
    """

    def __init__(self, *args: Any, field: str, **kwargs: Any) -> None:
        self.field = field
        super().__init__(*args, **kwargs)

    @property
    def help(self) -> str:
        from cdi_gen.config.settings import field_info

        info = field_info(self.field)
        text = info.description or ""
        out = text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
        default = info.default
        if default not in (None, (), False):
            # A list default shown as its variable takes it: space-separated.
            shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
            out += f" Default: {shown}."
        out += f"  [env: {_ENV_PREFIX}{self.field.upper()}"
        return out + (", space-separated]" if self.multiple else "]")

    @help.setter
    def help(self, value: str | None) -> None:
        pass  # always the field's description


def setting(field: str, *decls: str, **kwargs: Any) -> Callable[[F], F]:
    """A click option for ``Settings.<field>`` (see the module docstring)."""
    _FIELDS.add(field)
    return click.option(*decls, field, cls=_SettingOption, field=field, default=None, **kwargs)


def flags_of(values: dict[str, Any]) -> dict[str, Any]:
    """The settings flags among a command's parameters."""
    return {k: v for k, v in values.items() if k in _FIELDS}


CONFIG = setting("config", "--config", type=click.Path(path_type=Path, dir_okay=False))
SPEC_DIR = setting("spec_dir", "--spec-dir", type=click.Path(file_okay=False))
RUNTIME_SPEC_DIRS = setting(
    "runtime_spec_dirs",
    "--runtime-spec-dir",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False),
)
DEVICE_PLUGIN_DIR = setting(
    "device_plugin_dir", "--device-plugin-dir", type=click.Path(file_okay=False)
)
CDI_VERSION = setting("cdi_version", "--cdi-version")
RUNTIME = setting("runtime", "--runtime", multiple=True)
CRI_SOCKET = setting(
    "cri_socket", "--cri-socket", multiple=True, type=click.Path(path_type=Path, dir_okay=False)
)
API = setting("api", "--api", type=click.Choice(["config", "devicePlugin", "dra"]))
KUBECONFIG = setting("kubeconfig", "--kubeconfig", type=click.Path(dir_okay=False))
NODE_NAME = setting("node_name", "--node-name")

#: The one-shot commands (discover, render, write) read the config named here, no variable.
CONFIG_FILE = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Agent config (YAML or JSON). Default: the embedded catalogue.",
)
RECORDS = click.option(
    "--records",
    "records_path",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Use recorded udev data (`udevadm info --export-db` text, a JSON list of records, "
    "or what `cdi-gen record` writes) instead of this machine's devices.",
)
#: The pins of the one-shot commands: they read the agent's variables for these three only,
#: so `cdi-gen write` in the agent's environment pins what the agent pins.
PIN_CDI_VERSION = click.option(
    "--cdi-version",
    envvar="CDI_GEN_CDI_VERSION",
    help="Pin cdiVersion for classes without a pin of their own: X.Y.Z, or 'runtime' for the "
    "newest the node's container runtime reads. A class whose spec needs more is refused, "
    "naming the field. Default: the minimum each spec needs.  [env: CDI_GEN_CDI_VERSION]",
)
PIN_RUNTIME = click.option(
    "--runtime",
    "runtime_refs",
    multiple=True,
    envvar="CDI_GEN_RUNTIME",
    help="The node's container runtime(s) as NAME@VERSION (containerd, cri-o, podman; "
    "repeatable), for the 'runtime' pin and the doctor. Default: every runtime on PATH, "
    "asked for its version.  [env: CDI_GEN_RUNTIME, space-separated]",
)
PIN_CRI_SOCKET = click.option(
    "--cri-socket",
    "cri_sockets",
    multiple=True,
    # str, not click.Path: click splits a Path list from the environment on ':', and the
    # agent's variable is space-separated.
    envvar="CDI_GEN_CRI_SOCKET",
    help="CRI sockets asked for the runtime's name and version when no runtime binary is on "
    "PATH (in a pod), for the 'runtime' pin (repeatable). Default: "
    "/run/containerd/containerd.sock and /var/run/crio/crio.sock.  "
    "[env: CDI_GEN_CRI_SOCKET, space-separated]",
)


def not_empty_dir(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Refuse an empty folder: ``--spec-dir ""`` would mean the current folder."""
    from cdi_gen.errors import ConfigError

    if value == "":
        raise ConfigError(
            f"--{(param.name or '').replace('_', '-')}: an empty path is not a folder"
        )
    return Path(value)


def dns_subdomain(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Refuse a name that is not a DNS subdomain (``--instance``), quoting it."""
    from cdi_gen.errors import ConfigError, quote
    from cdi_gen.names import is_dns_subdomain

    if value is not None and not is_dns_subdomain(value):
        raise ConfigError(
            f"--{(param.name or '').replace('_', '-')}: {quote(value)} is not a DNS subdomain "
            "(lower-case letters, digits, '-' and '.', at most 253 characters)"
        )
    return value
