"""Pydantic models of the CDI specification document, versions 0.3.0 to 1.1.0.

Attributes are snake_case in Python and camelCase on the wire. Parsing is strict like the
runtimes' (`UnmarshalStrict`): an unknown field rejects the whole document. Structure only lives
here; the semantic rules (env syntax, paths, names) are in :mod:`cdi_gen.cdi.validation` and the
version rules in :mod:`cdi_gen.cdi.version`, so a document can be loaded, then judged with every
problem reported at once.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from cdi_gen.strictmodel import StrictModel

Uint32 = Annotated[int, Field(ge=0, le=0xFFFFFFFF)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class _Wire(StrictModel):
    model_config = ConfigDict(
        # Strict types too, as the runtimes' Go structs read them: "5" is no uint32.
        strict=True,
        # Built on first use: `render` and the agent build entries but never parse a whole
        # Spec unless they read a spec file, and building costs start-up time.
        defer_build=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase document, leaving out unset (None) fields."""
        return self.model_dump(by_alias=True, exclude_none=True)


class DeviceNode(_Wire):
    path: str
    host_path: str | None = None
    type: str | None = None
    major: Int64 | None = None
    minor: Int64 | None = None
    #: os.FileMode as a JSON integer, e.g. 438 = 0o666.
    file_mode: Uint32 | None = None
    permissions: str | None = None
    uid: Uint32 | None = None
    gid: Uint32 | None = None


class Mount(_Wire):
    host_path: str
    container_path: str
    options: list[str] | None = None
    type: str | None = None


class Hook(_Wire):
    hook_name: str
    path: str
    args: list[str] | None = None
    env: list[str] | None = None
    timeout: int | None = None


class NetDevice(_Wire):
    host_interface_name: str
    name: str


class IntelRdt(_Wire):
    # closID is spelled with a capital D on the wire, unlike the generated camelCase.
    clos_id: str | None = Field(default=None, alias="closID")
    l3_cache_schema: str | None = None
    mem_bw_schema: str | None = None
    #: 0.7.0 only; removed in 1.1.0.
    enable_cmt: bool | None = Field(default=None, alias="enableCMT")
    enable_mbm: bool | None = Field(default=None, alias="enableMBM")
    #: 1.1.0.
    schemata: list[str] | None = None
    enable_monitoring: bool | None = None


class ContainerEdits(_Wire):
    env: list[str] | None = None
    device_nodes: list[DeviceNode] | None = None
    hooks: list[Hook] | None = None
    mounts: list[Mount] | None = None
    net_devices: list[NetDevice] | None = None
    intel_rdt: IntelRdt | None = None
    additional_gids: list[Uint32] | None = None


class Device(_Wire):
    name: str
    annotations: dict[str, str] | None = None
    container_edits: ContainerEdits


class Spec(_Wire):
    #: Required: the version whose rules the reader judges the fields by (see validation).
    cdi_version: str
    kind: str
    annotations: dict[str, str] | None = None
    devices: list[Device]
    container_edits: ContainerEdits | None = None

    @property
    def vendor(self) -> str:
        return self.kind.partition("/")[0]

    @property
    def cls(self) -> str:
        return self.kind.partition("/")[2]
