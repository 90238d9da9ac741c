"""The boot this agent runs in: a DRA record of another boot is void.

A node reboot voids what the DRA driver prepared before it: device nodes are made anew, the
spec folder (``/var/run/cdi``, a tmpfs) is empty while the state folder is not, and the
kubelet prepares its running pods' claims again, each of which must get specs that exist and
were written after the boot. So the record of the prepared claims, the checkpoint file
(:mod:`~cdi_gen.dra.driver.checkpoint`), names the boot it was written in (``bootId``, from
format 4 on), the kernel's boot ID (``/proc/sys/kernel/random/boot_id``, a random UUID made
at each boot, read bounded). At start, a record of another boot is void: never answered, so
the kubelet's prepare reads the claim anew and writes fresh specs. A checkpoint of another
boot is kept aside whole, renamed to ``dra-<driver>.json.void-<boot ID>`` beside it
(:func:`set_aside`), with one line; the specs and metadata of its claims go as no prepared
claim's.

A record from before records named their boot: a checkpoint file of format 1 to 3 is of this
boot if it was last written after the boot started (a reboot stops every writer first), and
void if before, so a node rebooted with the older cdi-gen's file is not answered from it. So
is a checkpoint that is not JSON (empty or torn: it is written without fsync, and only a
power loss, which is a reboot, can leave it so) and was last written before the boot
started. A claim record a cdi-gen before format 5 left in its specs' owner records
(``bootId``, or none: of this boot, as its spec sits beside it and a reboot empties the spec
folder the agent is deployed with) is adopted at start only when of this boot.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cdi_gen.errors import CdiGenError, quote
from cdi_gen.files import FileRefused, read_regular
from cdi_gen.names import K8S_UUID_RULE, is_k8s_uuid

__all__ = [
    "BOOT_FIELD",
    "BOOT_ID_PATH",
    "Boot",
    "BootError",
    "read_boot",
    "record_boot",
    "set_aside",
]

log = logging.getLogger(__name__)

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
#: The field a record names its boot in.
BOOT_FIELD = "bootId"
#: A boot ID is 36 characters and a newline; anything much longer is not one.
_BOOT_ID_MAX_BYTES = 64


class BootError(CdiGenError):
    """The boot ID cannot be read: no record could say which boot it is of."""


@dataclass(frozen=True, slots=True)
class Boot:
    """This boot: its ID and when it started (wall-clock seconds)."""

    id: str
    started: float

    def wrote(self, boot_id: str | None, mtime: float) -> bool:
        """Whether a record naming ``boot_id`` (None: written before records named their
        boot), last written at ``mtime``, is of this boot."""
        if boot_id is not None:
            return boot_id == self.id
        return mtime >= self.started


def read_boot(path: Path | None = None) -> Boot:
    """The boot this agent runs in, read from ``path`` (the kernel's: :data:`BOOT_ID_PATH`);
    raises :class:`BootError` naming the file and why."""
    path = BOOT_ID_PATH if path is None else path
    try:
        raw = read_regular(path, _BOOT_ID_MAX_BYTES)
    except FileNotFoundError:
        raise BootError(f"{path}: cannot read the node's boot ID: not there") from None
    except FileRefused as exc:
        raise BootError(f"{path}: cannot read the node's boot ID: {exc}") from None
    text = raw.decode("ascii", "replace").strip()
    if not is_k8s_uuid(text):
        raise BootError(f"{path}: {quote(text)} is not a boot ID: want {K8S_UUID_RULE}")
    # CLOCK_BOOTTIME counts the time since the boot, suspended time included.
    return Boot(text, time.time() - time.clock_gettime(time.CLOCK_BOOTTIME))


def record_boot(doc: object, where: str = "record.") -> str | None:
    """The boot a record (a JSON object) names (None: written before records named one);
    raises ValueError naming the field (after ``where``)."""
    value = doc.get(BOOT_FIELD) if isinstance(doc, dict) else None
    if value is not None and not (isinstance(value, str) and is_k8s_uuid(value)):
        raise ValueError(f"{where}{BOOT_FIELD}: want {K8S_UUID_RULE}, got {quote(value)}")
    return value


def set_aside(path: Path, boot: Boot, written: str | None, mtime: float, count: int | None) -> Path:
    """Rename the checkpoint ``path``, of another boot (``written``, or None before records
    named their boot) and ``count`` claims (None: unreadable, torn by a power loss), aside,
    with one line; where it went. The name ends in neither ``.json`` nor ``.lock``, so it is
    never another driver's file. Raises OSError (the file stays)."""
    aside = path.with_name(f"{path.name}.void-{written or f'before-{int(mtime)}'}")
    os.rename(path, aside)
    if written is None:
        before = (
            f"written at {int(mtime)}, before this boot {boot.id} started at {int(boot.started)}"
        )
    else:
        before = f"written in boot {written}, not this boot {boot.id}"
    if count is None:
        held = "not JSON (torn by the power loss that ended that boot): its "
    else:
        held = f"its {count} "
    log.warning(
        "%s: %s: %sprepared claims are void, never answered (each is prepared anew when the "
        "kubelet asks); kept aside as %s",
        path,
        before,
        held,
        aside,
    )
    return aside
