"""The base of the config file's models: :class:`~cdi_gen.strictmodel.StrictModel` with
pydantic's type conversions and validators built on first use."""

from __future__ import annotations

from pydantic import ConfigDict

from cdi_gen.strictmodel import StrictModel

__all__ = ["ConfigModel"]


class ConfigModel(StrictModel):
    """The base of every model of the config file."""

    # Lax types (pydantic's conversions), unlike a spec's or a claim's: the configs in use
    # were accepted with them, and a stricter reading would refuse some.
    model_config = ConfigDict(
        # A parsed Template (cdi_gen.config.templates) is a plain class, held as it is.
        arbitrary_types_allowed=True,
        # Validators built on first use, not at import: only what is validated is built
        # (AgentConfig builds the classes' models inside its own), which start-up sees.
        defer_build=True,
    )
