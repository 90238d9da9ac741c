"""A device node created, or its stale node replaced, at its path inside a running container
(what ``follow`` does when a device comes back with new numbers), in the container's own mount
namespace and only beneath its ``/dev``.

:mod:`~cdi_gen.containernode.node` holds what one replacement is given (the container's
process, the node) and what it answers; :mod:`~cdi_gen.containernode.replace` runs it in a
short-lived child process so that no thread of the agent ever changes namespace;
:mod:`~cdi_gen.containernode.inside` is that child's side; :mod:`~cdi_gen.containernode.linux`
holds the Linux calls the standard library lacks (``setns``, ``openat2``). Standard library
only (ctypes).
"""
