"""A registry-free busybox image as an OCI image archive, for ``ctr images import``.

One layer holding Debian's static busybox and a link per applet. Its default command sleeps
forever, so the same image also serves as the CRI sandbox ("pause") image.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
IMAGE_NAME = "localhost/cdi-gen-test/busybox:1"
_EPOCH = 0  # fixed mtimes: the same busybox always gives the same digests


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = _EPOCH
    tar.addfile(info, io.BytesIO(data))


def _layer(busybox: Path) -> bytes:
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "proc", "sys", "tmp", "etc"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            info.mtime = _EPOCH
            tar.addfile(info)
        _add_bytes(tar, "bin/busybox", busybox.read_bytes(), 0o755)
        for applet in sorted(set(applets) - {"busybox"}):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            info.mtime = _EPOCH
            tar.addfile(info)
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _add_bytes(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", data)
    return digest


def build_archive(dest: Path, busybox: Path = BUSYBOX, name: str = IMAGE_NAME) -> Path:
    """Write the OCI archive to ``dest``; ``ctr images import`` names the image ``name``."""
    if not busybox.exists():
        raise FileNotFoundError(f"{busybox} missing: install Debian's busybox-static")
    layer = _layer(busybox)
    with tarfile.open(dest, "w") as tar:
        layer_digest = _blob(tar, layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sleep", "inf"]},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_digest = _blob(tar, config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config_bytes),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": len(layer),
                }
            ],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        manifest_digest = _blob(tar, manifest_bytes)
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        # ctr takes the full image name from this key ...
                        "io.containerd.image.name": name,
                        # ... and OCI tools the tag from this one.
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(tar, "index.json", json.dumps(index, sort_keys=True).encode())
    return dest
