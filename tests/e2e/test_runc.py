"""The Go CDI library injects a cdi-gen spec into an OCI config; runc runs it and the device
node works inside the container (reads return the backing file's bytes)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from consumers import GoCDI, Runc, cdi_gen
from loopdev import LoopDevices

MARKER = b"runc reads the loop device\n"


def _write_spec_for(loop_name: str, config_dir: Path, spec_dir: Path) -> Path:
    """A spec from ``cdi-gen write`` for one loop device."""
    config = config_dir / "config.yaml"
    config.write_text(
        "vendor: example.com\n"
        "classes:\n"
        "  - name: loop\n"
        f'    match: {{subsystem: block, kernel: "{loop_name}"}}\n'
        '    deviceName: "{kernel}"\n'
        "    containerEdits:\n"
        '      env: ["RUNC_DEVICE={name}"]\n'
    )
    proc = cdi_gen("write", "--config", config, "--spec-dir", spec_dir)
    assert proc.returncode == 0, proc.stderr
    spec = spec_dir / "example.com-loop.json"
    assert spec.exists(), sorted(spec_dir.iterdir())
    return spec


def test_go_library_injection_runs_under_runc(
    go_cdi: GoCDI, runc: Runc, loops: LoopDevices, busybox_rootfs: Path, tmp_path: Path
) -> None:
    backing = tmp_path / "backing.img"
    backing.write_bytes(MARKER + bytes(8192 - len(MARKER)))
    dev = loops.add()
    loops.attach(dev, backing)
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    _write_spec_for(dev.name, tmp_path, spec_dir)

    script = (
        f"stat -c '%t:%T' {dev.path}; echo RUNC_DEVICE=$RUNC_DEVICE; "
        f"dd if={dev.path} bs={len(MARKER)} count=1 2>/dev/null"
    )
    bundle = runc.bundle(tmp_path / "bundle", busybox_rootfs, ["sh", "-c", script])
    config = bundle / "config.json"
    result = go_cdi.inject(config, [spec_dir], [f"example.com/loop={dev.name}"])
    assert result.get("error") is None, result

    injected = json.loads(config.read_text())
    major, minor = dev.rdev()
    devices = injected["linux"]["devices"]
    assert {"path": str(dev.path), "type": "b", "major": major, "minor": minor}.items() <= next(
        d for d in devices if d["path"] == str(dev.path)
    ).items()
    allowed = injected["linux"]["resources"]["devices"]
    assert any(
        r.get("allow") and r.get("major") == major and r.get("minor") == minor for r in allowed
    ), allowed

    proc = runc.run(bundle, f"cdi-gen-{uuid.uuid4().hex[:12]}")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [f"{major:x}:{minor:x}", f"RUNC_DEVICE={dev.name}", MARKER.decode().strip()]


def test_go_library_refuses_unknown_name(go_cdi: GoCDI, runc: Runc, tmp_path: Path) -> None:
    bundle = runc.bundle(tmp_path / "bundle", tmp_path, ["true"])
    spec_dir = tmp_path / "empty"
    spec_dir.mkdir()
    result = go_cdi.inject(bundle / "config.json", [spec_dir], ["example.com/loop=absent"])
    assert result["unresolved"] == ["example.com/loop=absent"]
    assert "unresolvable CDI devices" in result["error"]
