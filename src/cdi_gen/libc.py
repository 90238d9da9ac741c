"""libc's functions for the Linux calls the standard library lacks, from one handle.

The handle is the C library the interpreter already has loaded (``dlopen(NULL)``): naming it
through ``ctypes.util.find_library`` would run ``ldconfig`` (a process, tens of milliseconds)
at the first use. :func:`function` gives each caller a pointer of its own, so the argument
and result types one module sets never change another's view of the same function.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctypes import _NamedFuncPointer

__all__ = ["function", "gil_holding_function", "optional_function"]


@functools.cache
def _handle() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def _gil_holding_handle() -> ctypes.PyDLL:
    return ctypes.PyDLL(None, use_errno=True)


def _typed(
    pointer: _NamedFuncPointer, argtypes: tuple[type, ...] | None, restype: type | None
) -> _NamedFuncPointer:
    if argtypes is not None:
        pointer.argtypes = argtypes
    pointer.restype = restype
    return pointer


def function(
    name: str, argtypes: tuple[type, ...] | None = None, restype: type | None = ctypes.c_int
) -> _NamedFuncPointer:
    """libc's ``name`` with its types, a pointer of the caller's own; ``errno`` is kept for
    :func:`ctypes.get_errno`. Raises :class:`AttributeError` when libc lacks it."""
    return _typed(_handle()[name], argtypes, restype)


def optional_function(
    name: str, argtypes: tuple[type, ...] | None = None, restype: type | None = ctypes.c_int
) -> _NamedFuncPointer | None:
    """As :func:`function`, or None when this libc has no such function (``renameat2``
    before glibc 2.28, say)."""
    try:
        return function(name, argtypes, restype)
    except AttributeError:
        return None


def gil_holding_function(
    name: str, argtypes: tuple[type, ...] | None = None, restype: type | None = ctypes.c_int
) -> _NamedFuncPointer:
    """libc's ``name`` called without releasing the GIL: for a call that never blocks and is
    made so often, from so many threads, that handing the GIL over costs more than the call."""
    return _typed(_gil_holding_handle()[name], argtypes, restype)
