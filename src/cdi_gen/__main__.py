"""Allows ``python -m cdi_gen``."""

from cdi_gen.cli import main

main()
