"""Allows ``python -m cdi_gen``."""

from cdi_gen.cli.main import main

main()
