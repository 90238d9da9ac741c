"""A DRA claim's configuration and its own files: its CDI specs and device metadata on disk.

:func:`device_configs` reads the allocation's opaque entries of our driver (the class's
first, then the claim's, in the API's order within each), refuses the claim naming the entry
and the field when one is not a valid ``DeviceConfig`` or comes from neither a DeviceClass nor
the claim, and gives each allocated device the entries that select its request, merged per
layer (:class:`~cdi_gen.dra.driver.claimconfig.Layered`: the DeviceClass's, the claim's).
:class:`ClaimFiles` writes, per class, the claim's transient spec
(:mod:`cdi_gen.dra.driver.claimspec`: the class's spec as the agent wrote it, served from
memory by :class:`~cdi_gen.cdi.store.SpecStore`, with the configuration
applied, refused when the claim's layer widens what its class grants) through the one writer,
with ownership records naming this agent's instance; takes all of them back when one fails (a
full disk), and removes them at unprepare, for a claim not prepared here whatever of ours sits
at their names (:meth:`ClaimFiles.remove_left`). What the claim's devices and specs are called,
and which device carries each request's metadata mount, is decided before any file is written
(:func:`claim_layout`, pure). The claim, with the specs written for it,
is recorded by the caller in the checkpoint (:mod:`~cdi_gen.dra.driver.checkpoint`), the one
store of prepared claims. At start, its :class:`~cdi_gen.dra.driver.claimsweep.ClaimSweep`
(:attr:`ClaimFiles.sweep`) finds the claim files no prepared claim names and the claims whose
files are gone (a node restart empties ``/var/run/cdi``: such a claim is read and prepared
anew), and reads, for the checkpoint to adopt, the claim records a cdi-gen before checkpoint
format 5 wrote into these owner records
(:meth:`~cdi_gen.dra.driver.claimsweep.ClaimSweep.recorded`).

With a ``metadata_dir``, every prepared claim gets, for each request, the device metadata
file (:mod:`cdi_gen.dra.driver.devicemetadata`, KEP-5304) that
:class:`~cdi_gen.dra.driver.metadatafiles.MetadataFolder` keeps there, named after the claim's
UID and the request (one flat folder: a file and a rename per request, where folders per
claim and request cost tens of times more to make and remove), mounted by the claim's spec
of the request's first configured device or, for a request with none, by its metadata spec
(:func:`~cdi_gen.dra.driver.claimspec.metadata_spec`): then every claim has a spec of its
own. The claim's files go with its specs. KEP-5304 has no Kubernetes
gate: the file is the driver's and reaches the container through CDI, which every kubelet
the driver supports passes on, so the driver serves it whenever it has a metadata folder
(the agent always gives it one).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.specnames import transient_filename
from cdi_gen.cdi.store import SpecStore, WrittenSpec
from cdi_gen.cdi.writer import remove_spec, write_bytes
from cdi_gen.dra.driver.claimcheck import is_request_name
from cdi_gen.dra.driver.claimconfig import (
    DeviceConfig,
    DeviceConfigError,
    Layered,
    merge,
    parse_device_config,
)
from cdi_gen.dra.driver.claimconfig import selects as config_selects
from cdi_gen.dra.driver.claimspec import (
    HostMode,
    Widening,
    claim_device_name,
    claim_spec,
    claim_tag,
    device_index,
    metadata_device_name,
    metadata_spec,
    metadata_tag,
)
from cdi_gen.dra.driver.claimsweep import ClaimSweep
from cdi_gen.dra.driver.devicemetadata import container_path, metadata_mount, metadata_stream
from cdi_gen.dra.driver.metadatafiles import MetadataFolder
from cdi_gen.dra.driver.netdata import network_data
from cdi_gen.dra.driver.preparedclaim import PreparedClaim, SpecName
from cdi_gen.dra.driver.refusal import DriverRefusal
from cdi_gen.dra.plugin.claims import ClaimRefused, PreparedDevice
from cdi_gen.errors import InvalidNameError, SpecError, SpecWriteError, quote
from cdi_gen.model import ClaimView, PoolDevice
from cdi_gen.names import parse_qualified_name

__all__ = ["ClaimFiles", "ClaimLayout", "carriers", "claim_layout", "device_configs", "host_mode"]

log = logging.getLogger(__name__)

#: The sources the API gives an entry: a DeviceClass's (the admin's) or the claim's own.
FROM_CLASS, FROM_CLAIM = "FromClass", "FromClaim"


def _shown(value: str, plain: bool) -> str:
    """A value from the API server in a message: as it is when it passed its rule, else
    quoted and cut (a newline must not start a forged log line)."""
    return value if plain else quote(value)


def _entry_label(index: int, source: str, requests: Sequence[str]) -> str:
    shown = ", ".join(_shown(r, is_request_name(r)) for r in requests)
    limited = f"requests {shown}" if requests else "all requests"
    source = _shown(source, source in (FROM_CLASS, FROM_CLAIM))
    return f"config entry status.allocation.devices.config[{index}] ({source}, {limited})"


def device_configs(
    label: str, claim: ClaimView, driver: str, requests: Sequence[str]
) -> list[Layered]:
    """For each allocated device, by the request it was allocated for, the configuration of
    our driver's entries that select it, merged per layer (empty: none does). Raises
    :class:`~cdi_gen.dra.plugin.claims.ClaimRefused` (``invalid-config``) naming the claim, the
    entry and the field when an entry of ours is not a valid ``DeviceConfig`` or its source
    is neither ``FromClass`` nor ``FromClaim`` (whose authority would it carry?); entries of
    other drivers are theirs and never read."""
    parsed: dict[str, list[tuple[Sequence[str], DeviceConfig]]] = {FROM_CLASS: [], FROM_CLAIM: []}
    for entry in (e for e in claim.config if e.driver == driver):
        where = f"{label}: {_entry_label(entry.index, entry.source, entry.requests)}"
        where += f" of driver {driver}"
        layer = parsed.get(entry.source)
        if layer is None:
            raise ClaimRefused(
                DriverRefusal.INVALID_CONFIG,
                f"{where}: source {quote(entry.source)} is neither {FROM_CLASS} nor {FROM_CLAIM}",
            )
        try:
            layer.append((entry.requests, parse_device_config(entry.parameters)))
        except DeviceConfigError as exc:
            raise ClaimRefused(DriverRefusal.INVALID_CONFIG, f"{where}: {exc}") from None

    def merged(source: str, request: str) -> DeviceConfig | None:
        return merge(c for limits, c in parsed[source] if config_selects(limits, request))

    return [Layered(merged(FROM_CLASS, r), merged(FROM_CLAIM, r)) for r in requests]


def host_mode(path: str) -> int | None:
    """The permission bits of the device node at ``path`` on the host (what a runtime gives
    a node whose spec sets no mode), or None when it is not a device node there."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return None
    return stat.S_IMODE(st.st_mode) & 0o777


#: Per kind (``vendor/class``), the configured devices of the claim's spec: each one's name in
#: its class's spec, its name in the claim's spec and its configuration.
Configured = dict[str, list[tuple[str, str, Layered]]]


@dataclass(frozen=True, slots=True)
class ClaimLayout:
    """What one claim gets, by name. ``devices``: the answer (a configured device named in the
    claim's spec, a carrier with the metadata device added); ``configured``: the claim's spec
    of each kind with a configured device (:data:`Configured`); ``metadata``: per kind, the
    devices of the claim's metadata spec; ``carriers``: per request, the device (index) that
    carries its metadata mount and the CDI device name it mounts through; ``specs``: the
    claim's specs, those of ``configured`` first, then those of ``metadata``."""

    devices: tuple[PreparedDevice, ...]
    configured: Configured
    metadata: dict[str, list[str]]
    carriers: dict[str, tuple[int, str]]
    specs: tuple[SpecName, ...]


def claim_layout(
    uid: str,
    devices: Sequence[PreparedDevice],
    configs: Sequence[Layered],
    pool: Mapping[str, PoolDevice],
    *,
    metadata: bool,
) -> ClaimLayout:
    """The layout of claim ``uid``'s ``devices``, each with its configuration (``configs``, in
    order; empty: none) and its entry in ``pool``; with ``metadata`` when every request gets
    its device metadata. Raises :class:`~cdi_gen.errors.InvalidNameError` when a configured
    device's CDI name is not a qualified one."""
    by_kind: Configured = {}
    out = list(devices)
    for index, (device, config) in enumerate(zip(devices, configs, strict=True)):
        if not config:
            continue
        vendor, cls, name = parse_qualified_name(pool[device.device].cdi_name)
        new_name = claim_device_name(uid, index)
        by_kind.setdefault(f"{vendor}/{cls}", []).append((name, new_name, config))
        out[index] = replace(device, cdi_device_ids=(f"{vendor}/{cls}={new_name}",))
    carried = carriers(uid, out, configs) if metadata else {}
    meta_kinds: dict[str, list[str]] = {}
    for index, name in carried.values():
        if configs[index]:
            continue
        kind = pool[out[index].device].cdi_name.partition("=")[0]
        meta_kinds.setdefault(kind, []).append(name)
        ids = (*out[index].cdi_device_ids, f"{kind}={name}")
        out[index] = replace(out[index], cdi_device_ids=ids)
    specs = (
        *(SpecName(kind, claim_tag(uid)) for kind in by_kind),
        *(SpecName(kind, metadata_tag(uid)) for kind in meta_kinds),
    )
    return ClaimLayout(tuple(out), by_kind, meta_kinds, carried, specs)


def carriers(
    uid: str, devices: Sequence[PreparedDevice], configs: Sequence[Layered]
) -> dict[str, tuple[int, str]]:
    """Per request, the claim device that carries its metadata mount (the runtime mounts
    each file once) and the CDI device name it mounts through: the request's first
    configured device, by its name in the claim's spec; else its first device, by a
    device of the claim's metadata spec."""
    found: dict[str, tuple[int, str]] = {}
    for index, device in enumerate(devices):
        request = device.request_names[0]
        if configs[index]:
            known = found.get(request)
            if known is None or not configs[known[0]]:
                name = device.cdi_device_ids[0].partition("=")[2]
                found[request] = (index, name)
        elif request not in found:
            found[request] = (index, metadata_device_name(uid, index))
    return found


class ClaimFiles:
    """The claims' transient specs in ``spec_dir``, written as cdi-gen ``instance`` for DRA
    driver ``driver``, each built from its class's spec as ``store`` holds it; with
    ``metadata_dir``, the claims' device metadata files there.
    ``read_mode`` reads a host node's mode (for a claim that sets owner or mode where its
    class's spec sets no mode)."""

    def __init__(
        self,
        spec_dir: Path,
        instance: str,
        *,
        store: SpecStore,
        driver: str = "",
        metadata_dir: Path | None = None,
        read_mode: HostMode = host_mode,
        sysfs: str = "/sys",
    ) -> None:
        self.spec_dir = Path(spec_dir)
        self.sysfs = sysfs
        self.instance = instance
        self.driver = driver
        self.metadata = None if metadata_dir is None else MetadataFolder(Path(metadata_dir))
        self.read_mode = read_mode
        self.store = store
        #: Class spec path -> (the write it indexes, its devices by name); claim_spec
        #: changes neither. Replaced whole, so safe from any server thread.
        self._indexed: dict[Path, tuple[WrittenSpec, dict[str, Mapping[str, Any]]]] = {}
        #: What start-up sets against the checkpoint's claims (see :meth:`recorded`).
        self.sweep = ClaimSweep(self.spec_dir, instance, self.metadata)

    @property
    def serves_metadata(self) -> bool:
        """Whether every prepared claim gets its device metadata (and so a spec of its own)."""
        return self.metadata is not None

    def write(
        self,
        uid: str,
        label: str,
        *,
        claim: ClaimView,
        devices: Sequence[PreparedDevice],
        configs: Sequence[Layered],
        pool: Mapping[str, PoolDevice],
    ) -> tuple[tuple[PreparedDevice, ...], tuple[SpecName, ...]]:
        """Write the claim's spec of each class with a configured device and, with metadata,
        each request's device metadata file and the metadata spec of each class whose device
        carries the mount of a request without a configured device; return the devices (a
        configured one now named in the claim's spec, a carrier with the metadata device
        added) and the specs written (:func:`claim_layout`).
        Raises :class:`~cdi_gen.dra.plugin.claims.ClaimRefused` (``widens-class`` when the
        claim asks for more than its class grants, else ``claim-spec``) naming the claim and
        why; what it wrote before failing is removed. ``claim`` is the one the kubelet asked
        for (namespace, name and UID checked)."""
        layout = claim_layout(uid, devices, configs, pool, metadata=self.metadata is not None)
        prepared = PreparedClaim(claim.namespace, claim.name, layout.devices, layout.specs)
        try:
            mounts = self._write_metadata(uid, claim, layout, pool)
            for spec, doc in self._documents(uid, layout, mounts):
                self._write_spec(spec, doc)
        # Undone whole: the spec being written too, which a failure after its rename (a
        # folder fsync) leaves in place, and any record a killed try left at its names.
        except Widening as exc:
            self._undo(label, uid, prepared)
            raise ClaimRefused(
                DriverRefusal.WIDENS_CLASS,
                f"{label}: its configuration asks for more than its class grants: {exc}",
            ) from None
        except (SpecError, SpecWriteError, InvalidNameError, OSError) as exc:
            self._undo(label, uid, prepared)
            why = str(exc).replace("\n", "; ")
            raise ClaimRefused(
                DriverRefusal.CLAIM_SPEC, f"{label}: its own CDI spec cannot be written: {why}"
            ) from None
        return layout.devices, layout.specs

    def _undo(self, label: str, uid: str, claim: PreparedClaim) -> None:
        """Remove what a failed :meth:`write` wrote; what cannot go is logged, and goes as an
        orphan at the next start (the refusal, not this, is the claim's answer)."""
        try:
            self.remove(label, uid, claim)
        except SpecWriteError as exc:
            log.warning(
                "%s: what its refused prepare wrote stays until the next start: %s", label, exc
            )

    def _documents(
        self, uid: str, layout: ClaimLayout, mounts: Mapping[str, Sequence[Mapping[str, Any]]]
    ) -> list[tuple[SpecName, dict[str, Any]]]:
        """Every spec of the claim's ``layout`` with its document, all built before any is
        written (a claim that widens its class writes none). Raises
        :class:`~cdi_gen.dra.driver.claimspec.Widening` and what building a spec raises."""
        configured = layout.specs[: len(layout.configured)]
        docs = [
            (spec, self._configured_spec(spec, entries, mounts))
            for spec, entries in zip(configured, layout.configured.values(), strict=True)
        ]
        docs += [
            (
                SpecName(kind, metadata_tag(uid)),
                metadata_spec(kind, {n: mounts[n] for n in names}),
            )
            for kind, names in layout.metadata.items()
        ]
        return docs

    def _write_spec(self, spec: SpecName, doc: dict[str, Any]) -> None:
        """Write one of the claim's specs, with its owner record, through the one writer."""
        vendor, _, cls = spec.kind.partition("/")
        write_bytes(
            self.spec_dir,
            vendor,
            cls,
            dump_document(doc),
            instance=self.instance,
            transient=spec.transient,
            notes=self.store.own_writes,
        )

    def _configured_spec(
        self,
        spec: SpecName,
        entries: Sequence[tuple[str, str, Layered]],
        mounts: Mapping[str, Sequence[Mapping[str, Any]]],
    ) -> dict[str, Any]:
        vendor, _, cls = spec.kind.partition("/")
        class_spec, by_name = self._class_spec(vendor, cls)
        return claim_spec(class_spec, entries, mounts, index=by_name, host_mode=self.read_mode)

    def _write_metadata(
        self,
        uid: str,
        claim: ClaimView,
        layout: ClaimLayout,
        pool: Mapping[str, PoolDevice],
    ) -> dict[str, list[dict[str, Any]]]:
        """Write the metadata file of each request the ``layout`` has a carrier for; return
        the mounts by the CDI device name that carries them."""
        folder = self.metadata
        if folder is None:
            return {}
        members: dict[str, list[PreparedDevice]] = {}
        for device in layout.devices:
            members.setdefault(device.request_names[0], []).append(device)
        mounts: dict[str, list[dict[str, Any]]] = {}
        for request, (_, name) in layout.carriers.items():
            data = metadata_stream(
                driver=self.driver,
                namespace=claim.namespace,
                claim=claim.name,
                uid=uid,
                pod_claim_name=claim.pod_claim_name,
                request=request,
                devices=[(d.pool, d.device, pool[d.device].attributes) for d in members[request]],
            )
            host = folder.write(uid, claim.namespace, claim.name, request, data)
            target = container_path(self.driver, claim.name, request, claim.pod_claim_name)
            mounts.setdefault(name, []).append(metadata_mount(str(host), target))
        return mounts

    def _class_spec(
        self, vendor: str, cls: str
    ) -> tuple[dict[str, Any], dict[str, Mapping[str, Any]]]:
        """The class's spec as the agent wrote it (from the store, while the folder's file
        is still that write's): the edits the claim's devices start from, with its devices
        by name, indexed once per write."""
        written = self.store.current(self.spec_dir, vendor, cls)
        cached = self._indexed.get(written.path)
        if cached is not None and cached[0] is written:
            return written.document(), cached[1]
        doc = written.document()
        index = device_index(doc)
        self._indexed[written.path] = (written, index)
        return doc, index

    def _edits(self, cdi_name: str) -> Mapping[str, Any]:
        """The ``containerEdits`` the class's spec gives device ``cdi_name``; empty when the
        spec cannot say."""
        try:
            vendor, cls, name = parse_qualified_name(cdi_name)
            _, by_name = self._class_spec(vendor, cls)
        except (SpecWriteError, InvalidNameError, OSError, ValueError):
            return {}
        edits = (by_name.get(name) or {}).get("containerEdits")
        return edits if isinstance(edits, Mapping) else {}

    def device_nodes(self, cdi_name: str) -> tuple[str, ...]:
        """The host device nodes the class's spec gives device ``cdi_name`` (what a claim's
        status shows); empty when the spec cannot say."""
        nodes = self._edits(cdi_name).get("deviceNodes") or []
        return tuple(str(n.get("hostPath") or n.get("path")) for n in nodes if isinstance(n, dict))

    def network_data(self, cdi_name: str) -> dict[str, str]:
        """What a claim's status shows of device ``cdi_name``'s interface (see
        :func:`~cdi_gen.dra.driver.netdata.network_data`); empty without one."""
        return network_data(self._edits(cdi_name), self.sysfs)

    def remove(self, label: str, uid: str, claim: PreparedClaim) -> None:
        """Remove the claim's specs (one already gone is fine; a record of ours at its name
        goes too), then its device metadata. Raises :class:`~cdi_gen.errors.SpecWriteError`
        naming the first that cannot be removed."""
        self._remove_specs(label, claim.specs)
        if self.metadata is not None:
            self.metadata.remove(uid, claim.namespace, claim.name, claim.requests)

    def remove_left(self, label: str, uid: str, kinds: Collection[str]) -> None:
        """Remove whatever of ours sits at the names claim ``uid``'s specs of ``kinds`` would
        have: for a claim no prepare recorded, what a refused prepare could not undo, or a
        writer killed between a record and its spec left (another instance's, in a rolling
        update: no start of this one sweeps it soon). By name, without listing the folder.
        Raises :class:`~cdi_gen.errors.SpecWriteError`."""
        tags = (claim_tag(uid), metadata_tag(uid))
        self._remove_specs(label, [SpecName(k, t) for k in sorted(kinds) for t in tags])

    def _remove_specs(self, label: str, specs: Iterable[SpecName]) -> None:
        for spec in specs:
            vendor, _, cls = spec.kind.partition("/")
            if remove_spec(
                self.spec_dir,
                vendor,
                cls,
                instance=self.instance,
                transient=spec.transient,
                notes=self.store.own_writes,
            ):
                log.info(
                    "%s: removed its spec %s",
                    label,
                    transient_filename(vendor, cls, spec.transient),
                )
