"""A cgroup folder is reached only beneath its hierarchy and never through a link: shown on a
real folder tree (a cgroup file system takes no links, so the tree stands in for one, its own
file system's magic given as the hierarchy's) and on the real cgroup hierarchies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi_gen.devcgroup.errors import DeviceCgroupError
from cdi_gen.devcgroup.folders import (
    CGROUP2_SUPER_MAGIC,
    CGROUP_SUPER_MAGIC,
    cgroup_folder,
    file_system,
)


def _magic(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return file_system(fd)
    finally:
        os.close(fd)


def _tree(tmp_path: Path) -> Path:
    hierarchy = tmp_path / "hierarchy"
    (hierarchy / "kubepods" / "pod1" / "ctr").mkdir(parents=True)
    (hierarchy / "kubepods" / "pod1" / "ctr" / "devices.allow").write_text("")
    (tmp_path / "elsewhere").mkdir()
    return hierarchy


def test_a_folder_beneath_the_hierarchy_is_opened(tmp_path: Path) -> None:
    hierarchy = _tree(tmp_path)
    with cgroup_folder(f"{hierarchy}/kubepods/pod1/ctr", str(hierarchy), _magic(tmp_path)) as fd:
        assert "devices.allow" in os.listdir(fd)


@pytest.mark.parametrize(
    ("link_at", "target"),
    [
        ("kubepods/pod1/ctr", "elsewhere"),  # the last component
        ("kubepods/pod1", "elsewhere"),  # one in the middle
        ("kubepods/pod1", "hierarchy/kubepods/pod1"),  # even to a folder of the hierarchy
    ],
)
def test_a_link_anywhere_on_the_path_is_never_followed(
    tmp_path: Path, link_at: str, target: str
) -> None:
    hierarchy = _tree(tmp_path)
    (tmp_path / "elsewhere" / "ctr").mkdir()
    moved = hierarchy / link_at
    moved.rename(tmp_path / "kept")
    moved.symlink_to(
        tmp_path / target if target != "hierarchy/kubepods/pod1" else tmp_path / "kept"
    )
    with (
        pytest.raises(DeviceCgroupError, match=r"is a link \(never followed\)") as raised,
        cgroup_folder(f"{hierarchy}/kubepods/pod1/ctr", str(hierarchy), _magic(tmp_path)),
    ):
        pass
    assert repr(Path(link_at).name) in str(raised.value)


@pytest.mark.parametrize(
    "path",
    [
        "{h}/kubepods/../../elsewhere",
        "{h}/kubepods/./pod1",
        "{h}/kubepods//pod1",
        "{h}/",
        "{h}",
        "{t}/elsewhere",
        "{h}-sibling/x",
        "kubepods/pod1",
    ],
)
def test_a_path_outside_or_climbing_is_refused(tmp_path: Path, path: str) -> None:
    hierarchy = _tree(tmp_path)
    (tmp_path / "hierarchy-sibling" / "x").mkdir(parents=True)
    given = path.format(h=hierarchy, t=tmp_path)
    with (
        pytest.raises(DeviceCgroupError) as raised,
        cgroup_folder(given, str(hierarchy), _magic(tmp_path)),
    ):
        pass
    assert repr(given)[:40] in str(raised.value)


def test_a_hierarchy_that_is_no_cgroup_file_system_is_refused(tmp_path: Path) -> None:
    hierarchy = _tree(tmp_path)
    with (
        pytest.raises(DeviceCgroupError, match="is not a cgroup v1 hierarchy"),
        cgroup_folder(f"{hierarchy}/kubepods", str(hierarchy), CGROUP_SUPER_MAGIC),
    ):
        pass


def test_the_v1_and_v2_hierarchies_are_told_apart() -> None:
    """The devices controller is cgroup v1, the unified hierarchy v2: each refused as the
    other (on this hybrid host)."""
    with (
        pytest.raises(DeviceCgroupError, match="its file system is cgroup v1"),
        cgroup_folder("/sys/fs/cgroup/devices/x", "/sys/fs/cgroup/devices", CGROUP2_SUPER_MAGIC),
    ):
        pass
    with (
        pytest.raises(DeviceCgroupError, match="its file system is cgroup v2"),
        cgroup_folder("/sys/fs/cgroup/unified/x", "/sys/fs/cgroup/unified", CGROUP_SUPER_MAGIC),
    ):
        pass
