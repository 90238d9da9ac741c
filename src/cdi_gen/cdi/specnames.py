"""The file names of spec files in a CDI spec folder: a class's, a transient spec's, and the
name an older agent gave a transient spec.

A class's spec is ``<vendor>-<class>.json``. A *transient* spec belongs to something
shorter-lived than its class (a DRA claim): ``<vendor>-<class>@<transient id>.json``. The CDI
library's own transient names join with ``_``, which a class name may hold too: class
``fpga_u1``'s spec and claim ``u1``'s spec of class ``fpga`` would be one file. No vendor,
class or transient ID holds ``@``, so the two kinds of names never meet;
:func:`legacy_transient_filename` is the ``_`` name older agents wrote, for
:func:`cdi_gen.cdi.writer.migrate_transient_names`. Every name is made from checked parts
only, so it is a plain file name (no ``/``, not ``..``, not hidden).
"""

from __future__ import annotations

import re

from cdi_gen import names
from cdi_gen.errors import InvalidNameError, SpecWriteError

__all__ = [
    "TRANSIENT_SEPARATOR",
    "checked_filename",
    "legacy_transient_filename",
    "spec_filename",
    "transient_filename",
]


def spec_filename(vendor: str, cls: str) -> str:
    """``<vendor>-<class>.json``, the conventional name of a class's spec file.

    Raises :class:`~cdi_gen.errors.InvalidNameError` unless both are valid CDI names, so the
    result is always a plain file name (no ``/``, not ``..``).
    """
    names.validate_vendor(vendor)
    names.validate_class(cls)
    return f"{vendor}-{cls}.json"


#: A transient ID: the characters of a Kubernetes UID, alphanumeric first, so the file name
#: holds no ``/``, is not hidden and is never one of our temporary or record names.
_TRANSIENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


#: Joins a transient spec's class and ID: a character no vendor, class or ID holds.
TRANSIENT_SEPARATOR = "@"
#: The separator of transient names before :data:`TRANSIENT_SEPARATOR` (the CDI library's).
_LEGACY_SEPARATOR = "_"


def transient_filename(vendor: str, cls: str, transient: str) -> str:
    """``<vendor>-<class>@<transient>.json``, the name of a transient spec.

    Raises :class:`~cdi_gen.errors.InvalidNameError` unless vendor and class are valid CDI
    names and ``transient`` is 1-128 of ``A-Z a-z 0-9 _ . -`` starting alphanumeric.
    """
    return _transient_name(vendor, cls, transient, TRANSIENT_SEPARATOR)


def legacy_transient_filename(vendor: str, cls: str, transient: str) -> str:
    """``<vendor>-<class>_<transient>.json``, the name an older agent gave a transient spec
    (the CDI library's); raises :class:`~cdi_gen.errors.InvalidNameError` as
    :func:`transient_filename` does."""
    return _transient_name(vendor, cls, transient, _LEGACY_SEPARATOR)


def _transient_name(vendor: str, cls: str, transient: str, separator: str) -> str:
    base = spec_filename(vendor, cls)
    if _TRANSIENT_RE.fullmatch(transient) is None:
        raise InvalidNameError(
            "transient spec ID",
            transient,
            "must be 1-128 characters of A-Z a-z 0-9 _ . - starting alphanumeric",
        )
    return f"{base.removesuffix('.json')}{separator}{transient}.json"


def checked_filename(vendor: str, cls: str, transient: str | None = None) -> str:
    """The spec file name of ``vendor/cls`` (its ``transient`` spec, when given); raises
    :class:`SpecWriteError` naming the part that is not a valid name."""
    try:
        if transient is not None:
            return transient_filename(vendor, cls, transient)
        return spec_filename(vendor, cls)
    except InvalidNameError as exc:
        raise SpecWriteError(f"refusing to touch the spec of {exc}") from None
