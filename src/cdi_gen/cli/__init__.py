"""The ``cdi-gen`` command line: one module per command, each only parsing and printing."""
