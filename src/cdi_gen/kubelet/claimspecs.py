"""A DRA claim's configuration and its own CDI specs on disk (the driver's state; no grpc).

:func:`device_configs` reads the allocation's opaque entries of our driver (the class's
first, then the claim's, in the API's order within each), refuses the claim naming the entry
and the field when one is not a valid ``DeviceConfig``, and gives each allocated device the
entries that select its request, merged. :class:`ClaimSpecs` writes, per class, the claim's
transient spec (:mod:`cdi_gen.discovery.claimspec`: the class's spec as written, with the
configuration applied) through the one writer, with ownership records naming this agent's
instance and carrying the claim's record (:func:`~cdi_gen.kubelet.checkpoint.claim_record`,
read back at start by :meth:`ClaimSpecs.recorded`); removes them at unprepare; and finds, at
start, those no prepared claim names and the claims whose files are gone (a node restart
empties ``/var/run/cdi``: such a claim is read and prepared anew).

With a ``metadata_dir``, the claim's spec also mounts, for each request with a configured
device, the device metadata file (:mod:`cdi_gen.discovery.devicemetadata`, KEP-5304) that
this module writes as ``<metadata_dir>/<namespace>_<claim>_<request>.json`` (one flat folder:
a file and a rename per request, where folders per claim and request cost tens of times more
to make and remove); the claim's files go with its specs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from cdi_gen.cdi.codec import dump_document
from cdi_gen.cdi.writer import (
    TEMP_SUFFIX,
    owned_transient_payloads,
    owned_transient_specs,
    remove_lone_transient_records,
    remove_spec,
    replace_file,
    spec_filename,
    transient_filename,
    write_bytes,
)
from cdi_gen.config.claimconfig import DeviceConfig, DeviceConfigError, merge, parse_device_config
from cdi_gen.config.claimconfig import selects as config_selects
from cdi_gen.discovery.claimspec import claim_device_name, claim_spec, claim_tag, device_index
from cdi_gen.discovery.devicemetadata import (
    base_request,
    container_path,
    metadata_mount,
    metadata_stream,
)
from cdi_gen.errors import InvalidNameError, SpecError, SpecWriteError, quote
from cdi_gen.files import SPEC_MAX_BYTES, FileRefused, read_regular
from cdi_gen.kubelet.checkpoint import ClaimSpec, PreparedClaim, claim_record, read_claim_record
from cdi_gen.kubelet.claims import ClaimRefused, PreparedDevice, Refusal
from cdi_gen.model import ClaimView, PoolDevice
from cdi_gen.names import parse_qualified_name

__all__ = ["ClaimSpecs", "device_configs"]

log = logging.getLogger(__name__)

#: The class's entries apply first, the claim's over them (the API orders them so too).
_ORDER = {"FromClass": 0, "FromClaim": 1}


def _entry_label(index: int, source: str, requests: Sequence[str]) -> str:
    limited = f"requests {', '.join(requests)}" if requests else "all requests"
    return f"config entry status.allocation.devices.config[{index}] ({source or '?'}, {limited})"


def device_configs(
    label: str, claim: ClaimView, driver: str, requests: Sequence[str]
) -> list[DeviceConfig | None]:
    """For each allocated device, by the request it was allocated for, the merged
    configuration of our driver's entries that select it (None: none does). Raises
    :class:`~cdi_gen.kubelet.claims.ClaimRefused` (``invalid-config``) naming the claim, the
    entry and the field when an entry of ours is not a valid ``DeviceConfig``; entries of
    other drivers are theirs and never read."""
    ours = sorted(
        (e for e in claim.config if e.driver == driver), key=lambda e: _ORDER.get(e.source, 2)
    )
    parsed = []
    for entry in ours:
        try:
            parsed.append((entry, parse_device_config(entry.parameters)))
        except DeviceConfigError as exc:
            raise ClaimRefused(
                Refusal.INVALID_CONFIG,
                f"{label}: {_entry_label(entry.index, entry.source, entry.requests)} of driver "
                f"{driver}: {exc}",
            ) from None
    return [
        merge(config for entry, config in parsed if config_selects(entry.requests, request))
        for request in requests
    ]


class ClaimSpecs:
    """The claims' transient specs in ``spec_dir``, written as cdi-gen ``instance`` for DRA
    driver ``driver``; with ``metadata_dir``, the claims' device metadata files there."""

    def __init__(
        self,
        spec_dir: Path,
        instance: str,
        *,
        driver: str = "",
        metadata_dir: Path | None = None,
    ) -> None:
        self.spec_dir = Path(spec_dir)
        self.instance = instance
        self.driver = driver
        self.metadata_dir = None if metadata_dir is None else Path(metadata_dir)
        #: Class spec path -> (its stat when read, its document, its devices by name);
        #: claim_spec changes neither. Used under the preparer's lock only.
        self._parsed: dict[
            Path, tuple[tuple[int, ...], dict[str, Any], dict[str, Mapping[str, Any]]]
        ] = {}

    def write(
        self,
        uid: str,
        label: str,
        *,
        claim: ClaimView,
        devices: Sequence[PreparedDevice],
        configs: Sequence[DeviceConfig | None],
        pool: Mapping[str, PoolDevice],
    ) -> tuple[tuple[PreparedDevice, ...], tuple[ClaimSpec, ...]]:
        """Write the claim's spec of each class with a configured device (and its device
        metadata); return the devices (a configured one now named in the claim's spec) and
        the specs written. Raises :class:`~cdi_gen.kubelet.claims.ClaimRefused`
        (``claim-spec``) naming the claim and why; what it wrote before failing is removed."""
        by_kind: dict[str, list[tuple[str, str, DeviceConfig]]] = {}
        out = list(devices)
        for index, (device, config) in enumerate(zip(devices, configs, strict=True)):
            if config is None:
                continue
            vendor, cls, name = parse_qualified_name(pool[device.device].cdi_name)
            new_name = claim_device_name(uid, index)
            by_kind.setdefault(f"{vendor}/{cls}", []).append((name, new_name, config))
            out[index] = replace(device, cdi_device_ids=(f"{vendor}/{cls}={new_name}",))
        specs = tuple(ClaimSpec(kind, claim_tag(uid)) for kind in by_kind)
        # The claim's record rides in each of its specs' owner records (written before the
        # spec): the claim is prepared exactly as long as a spec of it is there.
        record = claim_record(uid, PreparedClaim(claim.namespace, claim.name, tuple(out), specs))
        written: list[ClaimSpec] = []
        try:
            mounts = self._write_metadata(uid, claim, out, configs, pool)
            for spec, entries in zip(specs, by_kind.values(), strict=True):
                vendor, _, cls = spec.kind.partition("/")
                class_spec, by_name = self._class_spec(vendor, cls)
                doc = claim_spec(class_spec, entries, mounts, index=by_name)
                write_bytes(
                    self.spec_dir,
                    vendor,
                    cls,
                    dump_document(doc),
                    instance=self.instance,
                    transient=spec.transient,
                    payload=record,
                )
                written.append(spec)
        except (SpecError, SpecWriteError, InvalidNameError, OSError) as exc:
            self.remove(label, claim.namespace, claim.name, written)
            why = str(exc).replace("\n", "; ")
            raise ClaimRefused(
                Refusal.CLAIM_SPEC, f"{label}: its own CDI spec cannot be written: {why}"
            ) from None
        return tuple(out), specs

    @staticmethod
    def _claim_prefix(namespace: str, name: str) -> str:
        # A namespace and a request are DNS labels and a name a DNS subdomain (checked before
        # the claim was read): no "/", never "..", and "_" occurs in none, so the prefix is
        # the claim's alone.
        return f"{namespace}_{name}_"

    def _metadata_files(self, namespace: str, name: str) -> list[Path]:
        if self.metadata_dir is None:
            return []
        prefix = self._claim_prefix(namespace, name)
        try:
            entries = os.listdir(self.metadata_dir)
        except FileNotFoundError:
            return []
        return [
            self.metadata_dir / e for e in entries if e.startswith(prefix) and e.endswith(".json")
        ]

    def _write_metadata(
        self,
        uid: str,
        claim: ClaimView,
        devices: Sequence[PreparedDevice],
        configs: Sequence[DeviceConfig | None],
        pool: Mapping[str, PoolDevice],
    ) -> dict[str, list[dict[str, Any]]]:
        """Write the metadata file of each request with a configured device; return the
        mounts by the claim device that carries them (the request's first configured one:
        the runtime mounts each file once)."""
        folder = self.metadata_dir
        if folder is None:
            return {}
        prefix = self._claim_prefix(claim.namespace, claim.name)
        by_request: dict[str, list[int]] = {}
        for index, device in enumerate(devices):
            by_request.setdefault(device.request_names[0], []).append(index)
        mounts: dict[str, list[dict[str, Any]]] = {}
        for request, indexes in by_request.items():
            carrier = next((i for i in indexes if configs[i] is not None), None)
            if carrier is None:
                continue
            host = folder / f"{prefix}{base_request(request)}.json"
            members = [devices[i] for i in indexes]
            data = metadata_stream(
                driver=self.driver,
                namespace=claim.namespace,
                claim=claim.name,
                uid=uid,
                pod_claim_name=claim.pod_claim_name,
                request=request,
                devices=[(d.pool, d.device, pool[d.device].attributes) for d in members],
            )
            # Not fsynced: nothing reads it after a power loss before it is written anew (the
            # claim's spec, on /var/run's tmpfs, is gone then, so the claim is prepared again).
            replace_file(host, data, mode=0o644, durable=False)
            target = container_path(self.driver, claim.name, request, claim.pod_claim_name)
            name = devices[carrier].cdi_device_ids[0].partition("=")[2]
            mounts.setdefault(name, []).append(metadata_mount(str(host), target))
        return mounts

    def _class_spec(
        self, vendor: str, cls: str
    ) -> tuple[dict[str, Any], dict[str, Mapping[str, Any]]]:
        """The class's spec as the agent wrote it: the edits the claim's devices start from.
        Parsed again only when the file changed (the agent replaces it by a rename, so a new
        inode or time), since a class of many devices costs more to parse than the rest."""
        path = self.spec_dir / spec_filename(vendor, cls)
        try:
            st = os.lstat(path)
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            cached = self._parsed.get(path)
            if cached is not None and cached[0] == key:
                return cached[1], cached[2]
            doc = orjson.loads(read_regular(path, SPEC_MAX_BYTES, follow_symlinks=False))
        except FileNotFoundError:
            raise SpecWriteError(f"{str(path)!r}: the class's spec is missing") from None
        except (FileRefused, OSError, orjson.JSONDecodeError) as exc:
            raise SpecWriteError(f"{str(path)!r}: the class's spec cannot be read: {exc}") from None
        if not isinstance(doc, dict):
            raise SpecWriteError(f"{str(path)!r}: the class's spec is not a JSON object")
        index = device_index(doc)
        self._parsed[path] = (key, doc, index)
        return doc, index

    def remove(self, label: str, namespace: str, name: str, specs: Iterable[ClaimSpec]) -> None:
        """Remove the claim's ``specs`` (one already gone is fine), then its device metadata.
        Raises :class:`~cdi_gen.errors.SpecWriteError` naming the first that cannot be
        removed."""
        for spec in specs:
            vendor, _, cls = spec.kind.partition("/")
            if remove_spec(
                self.spec_dir, vendor, cls, instance=self.instance, transient=spec.transient
            ):
                log.info(
                    "%s: removed its spec %s",
                    label,
                    transient_filename(vendor, cls, spec.transient),
                )
        for path in self._metadata_files(namespace, name):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise SpecWriteError(
                    f"{str(path)!r}: cannot remove the claim's device metadata: {exc}"
                ) from exc

    def recorded(self) -> dict[str, PreparedClaim]:
        """The claims recorded with their specs (:meth:`write`), by UID: read from the owner
        records of this instance's transient specs. A record that cannot be read as a claim,
        or that names a spec it does not sit beside, is logged and left out (its spec is then
        no prepared claim's, and goes as an orphan)."""
        found: dict[str, PreparedClaim] = {}
        for vendor, cls, transient, payload in owned_transient_payloads(
            self.spec_dir, instance=self.instance
        ):
            name = transient_filename(vendor, cls, transient)
            try:
                uid, claim = read_claim_record(payload)
                if ClaimSpec(f"{vendor}/{cls}", transient) not in claim.specs:
                    raise ValueError(f"record.specs: does not name {name}")
            except ValueError as exc:
                log.warning("spec %s: its claim record is unreadable: %s", quote(name), exc)
                continue
            found.setdefault(uid, claim)
        return found

    def intact(self, namespace: str, name: str, specs: Iterable[ClaimSpec]) -> bool:
        """Whether a prepared claim's files are all there: its specs and, with metadata, at
        least one metadata file, each a readable JSON stream (written without fsync, a power
        loss may have left one empty)."""
        for spec in specs:
            vendor, _, cls = spec.kind.partition("/")
            try:
                if not (self.spec_dir / transient_filename(vendor, cls, spec.transient)).is_file():
                    return False
            except (InvalidNameError, OSError):
                return False
        if self.metadata_dir is None:
            return True
        try:
            files = self._metadata_files(namespace, name)
            for path in files:
                first = read_regular(path, SPEC_MAX_BYTES, follow_symlinks=False).split(b"\n")[0]
                orjson.loads(first)
        except (OSError, FileRefused, orjson.JSONDecodeError):
            return False
        return bool(files)

    def remove_orphans(
        self, recorded: Iterable[ClaimSpec], claims: Iterable[tuple[str, str]] = ()
    ) -> int:
        """Remove this instance's transient specs that no prepared claim names, the owner
        records whose spec is gone, and the device metadata of claims not in ``claims``
        (namespace, name); how many specs."""
        self._remove_orphan_metadata({self._claim_prefix(ns, name) for ns, name in claims})
        for name in remove_lone_transient_records(self.spec_dir, instance=self.instance):
            log.info("removed the owner record of spec %s: the spec is not there", quote(name))
        keep = {(s.kind, s.transient) for s in recorded}
        removed = 0
        for vendor, cls, transient in owned_transient_specs(self.spec_dir, instance=self.instance):
            if (f"{vendor}/{cls}", transient) in keep:
                continue
            name = transient_filename(vendor, cls, transient)
            try:
                if remove_spec(
                    self.spec_dir, vendor, cls, instance=self.instance, transient=transient
                ):
                    removed += 1
                    log.info("removed spec %s: no prepared claim names it", quote(name))
            except SpecWriteError as exc:
                log.warning("spec %s of no prepared claim stays: %s", quote(name), exc)
        return removed

    def _remove_orphan_metadata(self, keep: set[str]) -> None:
        """Remove the metadata files of claims whose prefix is not in ``keep``, and the
        temporary files of a write killed half-way."""
        if self.metadata_dir is None:
            return
        try:
            entries = os.listdir(self.metadata_dir)
        except OSError:
            return  # none yet
        for entry in entries:
            if entry.startswith(".") and entry.endswith(TEMP_SUFFIX):
                pass
            elif not entry.endswith(".json") or entry.count("_") != 2:
                continue  # not a name this module gives: left alone
            elif entry[: entry.rindex("_") + 1] in keep:
                continue
            try:
                os.unlink(self.metadata_dir / entry)
                log.info("removed device metadata %s: no prepared claim names it", quote(entry))
            except OSError as exc:
                log.warning("device metadata %s of no prepared claim stays: %s", quote(entry), exc)
