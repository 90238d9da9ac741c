"""A container's device access changed in place, on cgroup v1 and v2 (what ``follow`` uses
when a device comes back with new numbers).

:mod:`~cdi_gen.devcgroup.rules` reads the rules a runtime gave a container and moves one
device's; :mod:`~cdi_gen.devcgroup.access` computes what a rule list grants, as runc does;
:mod:`~cdi_gen.devcgroup.program` assembles the cgroup v2 device program for it and
:mod:`~cdi_gen.devcgroup.bpf` loads, lists and attaches programs through ``bpf(2)``;
:mod:`~cdi_gen.devcgroup.cgroupv2` replaces a cgroup's program in one step and
:mod:`~cdi_gen.devcgroup.cgroupv1` writes the devices controller's files;
:mod:`~cdi_gen.devcgroup.folders` opens a cgroup folder without following a link;
:mod:`~cdi_gen.devcgroup.errors` holds the errors. Standard library only (ctypes).
"""
