"""A full disk never costs cdi-gen the ownership of its own spec (issue 11, defect 2).

On a real 64 KiB tmpfs, mounted in a private mount namespace (so nothing outlives the test,
even if it is killed): write 2 devices, fill the disk to ~4 KiB free, fail to write 500 and
then 501 devices, free the space, and the next write must succeed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import orjson

from tests.mountns import run_private

CONFIG = """\
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop*"}
"""

SCENARIO = textwrap.dedent(
    """
    import os, subprocess, sys
    mnt, config, records = sys.argv[1], sys.argv[2], sys.argv[3]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], check=True)
    spec_dir = os.path.join(mnt, "cdi")

    def write(count):
        r = subprocess.run(
            [sys.executable, "-m", "cdi_gen", "write", "--config", config,
             "--records", f"{records}.{count}", "--spec-dir", spec_dir],
            capture_output=True, text=True,
        )
        print(f"write {count}: exit {r.returncode}: {r.stdout.strip()} {r.stderr.strip()}")
        return r.returncode

    assert write(2) == 0
    filler = os.path.join(mnt, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    os.close(fd)
    size = os.path.getsize(filler)
    os.truncate(filler, max(0, size - 4096))
    st = os.statvfs(mnt)
    print("free bytes:", st.f_bavail * st.f_frsize)
    assert write(500) != 0
    assert write(501) != 0
    os.unlink(filler)
    print("RESULT", write(3))
    """
)


def make_records(count: int) -> list[dict[str, object]]:
    return [
        {
            "sys_path": f"/sys/devices/virtual/block/loop{n}",
            "subsystem": "block",
            "devnode": f"/dev/loop{n}",
            "devtype": "disk",
            "major": 7,
            "minor": n,
        }
        for n in range(count)
    ]


def test_spec_stays_ours_after_writes_fail_on_a_full_disk(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    for count in (2, 3, 500, 501):
        (tmp_path / f"records.json.{count}").write_bytes(orjson.dumps(make_records(count)))
    (tmp_path / "mnt").mkdir()
    args = [
        "-c", SCENARIO,
        str(tmp_path / "mnt"), str(tmp_path / "config.yaml"), str(tmp_path / "records.json"),
    ]  # fmt: skip
    stdout = run_private(args, timeout=120)
    assert "RESULT 0" in stdout, stdout
