"""The one strict pydantic base model, and pydantic's errors as one problem each.

Every document cdi-gen reads through pydantic (the config file, a CDI spec, a claim's opaque
``DeviceConfig``) refuses what its author may have mistyped: an unknown key is an error, not
ignored; the values are frozen once read; keys are camelCase on the wire and snake_case in
Python (either is accepted). :class:`StrictModel` says this once; each use adds what is its
own (type strictness, when validators are built) in its own ``model_config``.

:func:`problems` turns a :class:`~pydantic.ValidationError` into one
:class:`~cdi_gen.errors.Problem` per error, its place and message said the way the reader of
that document knows them (a config path, a flag, a claim's ``parameters``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from cdi_gen.errors import Problem

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails

__all__ = ["FieldError", "Loc", "StrictModel", "problems"]

#: Where an error is in the validated data: keys and list indices, outermost first.
Loc = tuple[int | str, ...]


class StrictModel(BaseModel):
    """Unknown keys refused, frozen, camelCase aliases (snake_case names accepted too)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class FieldError(ValueError):
    """A problem found by a whole-model validator but belonging to one field: ``loc`` is
    relative to the model whose validator raised it."""

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


def problems(
    exc: ValidationError,
    *,
    where: Callable[[Loc], str],
    message: Callable[[ErrorDetails], str],
    unknown_at_parent: bool = False,
) -> list[Problem]:
    """One :class:`Problem` per error of ``exc``, in pydantic's order: ``where`` says the
    place of a location, ``message`` the rule broken. A :class:`FieldError` is placed at its
    own location with its own message.

    ``unknown_at_parent`` places an unknown key at the mapping that holds it (the config's
    messages name the key and the keys allowed there); otherwise at the key itself.
    """
    out: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, FieldError):
            out.append(Problem(where((*loc, *inner.loc)), inner.message))
            continue
        if unknown_at_parent and err["type"] == "extra_forbidden":
            loc = loc[:-1]
        out.append(Problem(where(loc), message(err)))
    return out
