"""``cdi-gen validate`` and ``cdi-gen render`` wall time against the Go CDI library
validating the same files.

    python benchmarks/bench_validate.py [--quick]

The Go side is tests/e2e/cdicheck (Debian's CDI library 0.5.2, the one podman 4.3 embeds),
built offline here. Both sides are timed as whole processes, start-up included, because that is
what an operator or a CI job pays; the process start-up floors are listed too so the ratio can
be read correctly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import Row, best_ms, cli_env, print_table

from tests.e2e.cdicheck.build import CDICHECK_SRC, GO_CDI_SRC, build_command

REPO = Path(__file__).resolve().parents[1]
# Python start-up plus imports is a fixed cost a Go binary does not have; beyond this the
# validator itself is slow.
TARGET_RATIO = 10.0


def _spec(i: int, devices: int) -> dict[str, object]:
    return {
        "cdiVersion": "0.5.0",
        "kind": f"example.com/class{i}",
        "containerEdits": {"env": [f"CLASS_INDEX={i}"]},
        "devices": [
            {
                "name": f"dev{d}",
                "containerEdits": {
                    "deviceNodes": [
                        {"path": f"/dev/bench{i}_{d}", "type": "c", "major": 240, "minor": d}
                    ],
                    "env": [f"BENCH_DEVICE={i}-{d}"],
                    "mounts": [
                        {
                            "hostPath": f"/opt/bench/{d}",
                            "containerPath": f"/opt/bench/{d}",
                            "options": ["ro", "bind"],
                        }
                    ],
                },
            }
            for d in range(devices)
        ],
    }


def _loop_records(n: int) -> list[dict[str, object]]:
    """Recorded-udev entries of n loop devices (the shape ``--records`` reads)."""
    return [
        {
            "sys_path": f"/sys/devices/virtual/block/loop{i}",
            "subsystem": "block",
            "sys_name": f"loop{i}",
            "sys_number": str(i),
            "devnode": f"/dev/loop{i}",
            "devtype": "disk",
            "major": 7,
            "minor": i,
            "properties": {"DEVTYPE": "disk"},
        }
        for i in range(n)
    ]


RENDER_CONFIG = """\
vendor: example.com
classes:
  - name: loop
    match: {subsystem: block, kernel: "loop*"}
    containerEdits:
      env: ["LOOP_DEVICE={devnode}"]
      mounts: [{hostPath: /opt/loop-tools, containerPath: /opt/loop-tools, options: [ro, bind]}]
"""


def _build_cdicheck(workdir: Path) -> Path | None:
    go = shutil.which("go")
    if go is None or not GO_CDI_SRC.is_dir():
        return None
    argv, env, binary = build_command(go, workdir)
    subprocess.run(argv, cwd=CDICHECK_SRC, env=env, check=True, capture_output=True)
    return binary


def _run(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, capture_output=True, check=False, env=cli_env())


def run(quick: bool = False) -> list[Row]:
    files, devices = (10, 20) if quick else (100, 100)
    repeat = 3 if quick else 5
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="cg-bench-validate-") as tmp:
        work = Path(tmp)
        folder = work / "specs"
        folder.mkdir()
        paths = []
        for i in range(files):
            path = folder / f"example.com-class{i}.json"
            path.write_text(json.dumps(_spec(i, devices)))
            paths.append(str(path))
        label = f"{files} files x {devices} devices"

        ours_cmd = [sys.executable, "-m", "cdi_gen", "validate", "-q", *paths]
        check = _run(ours_cmd)
        if check.returncode != 0:
            raise RuntimeError(f"cdi-gen validate rejected the benchmark specs: {check.stdout!r}")
        ours_ms = best_ms(lambda: _run(ours_cmd), repeat)
        floor_ms = best_ms(lambda: _run([sys.executable, "-m", "cdi_gen", "--version"]), repeat)
        rows.append((f"cdi-gen validate, {label}", f"{ours_ms:.0f} ms", ""))
        rows.append(("cdi-gen --version (start-up floor)", f"{floor_ms:.0f} ms", ""))

        binary = _build_cdicheck(work)
        if binary is None:
            rows.append(
                (
                    "Go CDI 0.5.2 validate",
                    "not run: needs go and the Go CDI library",
                    "scripts/setup.sh test",
                )
            )
            return rows
        go_cmd = [str(binary), "validate", *paths]
        verdicts = json.loads(_run(go_cmd).stdout)["files"]
        if not all(v["ok"] for v in verdicts.values()):
            raise RuntimeError("the Go CDI library rejected the benchmark specs")
        go_ms = best_ms(lambda: _run(go_cmd), repeat)
        go_floor_ms = best_ms(lambda: _run([str(binary), "validate"]), repeat)
        rows.append((f"Go CDI 0.5.2 validate, {label}", f"{go_ms:.0f} ms", ""))
        rows.append(("Go cdicheck, no files (start-up floor)", f"{go_floor_ms:.0f} ms", ""))
        # With --quick the files are too few for anything but start-up to show.
        target = "start-up bound (--quick)" if quick else f"<= {TARGET_RATIO:.0f}x"
        rows.append(("ratio cdi-gen / Go (wall)", f"{ours_ms / go_ms:.1f}x", target))
        work_ratio = max(ours_ms - floor_ms, 0.0) / max(go_ms - go_floor_ms, 0.1)
        rows.append(("ratio above start-up floors", f"{work_ratio:.1f}x", "informative"))
        rows += _render_rows(work, binary, quick, repeat)
    return rows


def _render_rows(work: Path, binary: Path, quick: bool, repeat: int) -> list[Row]:
    """Render one class of n devices, then let Go validate the file render wrote."""
    n = 1_000 if quick else 10_000
    records = work / "records.json"
    records.write_text(json.dumps(_loop_records(n)))
    config = work / "render.yaml"
    config.write_text(RENDER_CONFIG)
    out = work / "rendered" / "example.com-loop.json"
    out.parent.mkdir()
    render_cmd = [
        sys.executable, "-m", "cdi_gen", "render", "--config", str(config),
        "--records", str(records), "--class", "loop", "--output", str(out),
    ]  # fmt: skip
    proc = _run(render_cmd)
    if proc.returncode != 0:
        raise RuntimeError(f"cdi-gen render failed: {proc.stderr!r}")
    go_cmd = [str(binary), "validate", str(out)]
    verdict = json.loads(_run(go_cmd).stdout)["files"][str(out)]
    if not verdict["ok"] or len(verdict["devices"]) != n:
        raise RuntimeError(f"the Go CDI library did not take the rendered spec: {verdict}")
    render_ms = best_ms(lambda: _run(render_cmd), repeat)
    go_ms = best_ms(lambda: _run(go_cmd), repeat)
    target = "start-up bound (--quick)" if quick else f"<= {TARGET_RATIO:.0f}x"
    return [
        (f"cdi-gen render, 1 class x {n} devices", f"{render_ms:.0f} ms", ""),
        ("Go CDI 0.5.2 validate of that file", f"{go_ms:.0f} ms", ""),
        ("ratio render / Go validate (wall)", f"{render_ms / go_ms:.1f}x", target),
    ]


if __name__ == "__main__":
    print_table("validate", run(quick="--quick" in sys.argv))
