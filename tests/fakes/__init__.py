"""Fakes of the programs cdi-gen talks to, real enough to talk back over real sockets."""
