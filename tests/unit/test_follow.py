"""The follow step's pure parts: which cgroup hierarchies the mounts give, and where a
container's cgroupsPath is below them (the step itself: tests/integration/test_follow_real.py)."""

from __future__ import annotations

import pytest

from cdi_gen.agent.follow import Hierarchies, cgroup_relative
from cdi_gen.devcgroup.errors import DeviceRuleError

MOUNTS = (
    "30 24 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    "35 24 0:31 / /sys/fs/cgroup/devices rw,nosuid - cgroup cgroup rw,devices\n"
    "36 24 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
)


def test_the_mounts_say_which_hierarchies_apply() -> None:
    assert Hierarchies.of_mounts(MOUNTS) == Hierarchies(
        "/sys/fs/cgroup/devices", "/sys/fs/cgroup/unified"
    )
    v2_only = "25 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert Hierarchies.of_mounts(v2_only) == Hierarchies(None, "/sys/fs/cgroup")
    assert Hierarchies.of_mounts(MOUNTS.splitlines()[2]) == Hierarchies(None, None)
    assert Hierarchies.of_mounts("garbage\n\n1 2 3\n") == Hierarchies(None, None)


def test_a_cgroups_path_in_either_form_is_a_path_below_the_hierarchy() -> None:
    assert cgroup_relative("/kubepods/besteffort/pod12/abc") == "/kubepods/besteffort/pod12/abc"
    assert cgroup_relative("kubepods-besteffort-pod12.slice:cri-containerd:abc") == (
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice/"
        "cri-containerd-abc.scope"
    )
    assert cgroup_relative("system.slice:crio:abc") == "/system.slice/crio-abc.scope"


@pytest.mark.parametrize("path", ["", "kubepods", "a:b", "kubepods.slice:cri-containerd:"])
def test_a_cgroups_path_of_neither_form_is_refused_in_one_line(path: str) -> None:
    with pytest.raises(DeviceRuleError, match="is neither a path nor 'slice:prefix:name'"):
        cgroup_relative(path)
