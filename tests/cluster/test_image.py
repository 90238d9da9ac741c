"""The agent image from deploy/Containerfile runs cdi-gen, before any cluster exists, and says
what it is: the OCI labels and ``cdi-gen --version`` name the package version, the revision
image.py stamped and the lock it installed from; the package is the wheel's, not the source tree.

The container runs under the DaemonSet's restrictions (read-only root, no capabilities, no
privilege escalation, root user), so a failure here is one the DaemonSet would meet too.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import lockfile

from .image import AGENT_INPUTS, REPO, AgentImage

# A cold image build (base from Debian, pip from PyPI) takes minutes; the checks themselves
# take under a second each.
pytestmark = pytest.mark.timeout(900)

CONFIGMAP = REPO / "deploy" / "kubernetes" / "base" / "configmap.yaml"
# The DaemonSet's securityContext, as podman options.
RESTRICTED = (
    "--read-only",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--user=0",
    "--network=none",
)


def podman_run(
    image: AgentImage, args: Sequence[str], options: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    argv = image.podman.argv(["run", "--rm", *RESTRICTED, *options, image.name, *args])
    return subprocess.run(
        argv, env=image.podman.env(), capture_output=True, text=True, timeout=120, check=False
    )


def shipped_config(dest: Path) -> Path:
    (cm,) = [d for d in yaml.safe_load_all(CONFIGMAP.read_text()) if d]
    dest.write_text(cm["data"]["config.yaml"])
    return dest


def _inspect(image: AgentImage, template: str) -> Any:
    proc = subprocess.run(
        image.podman.argv(["image", "inspect", "--format", template, image.name]),
        env=image.podman.env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout)


def test_image_reports_the_checkout_version_and_revision(agent_image: AgentImage) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    # The last commit that changed what the image is built from (image.py's stamp); a copy of
    # the checkout without .git (as CI runs the suite) has none, and the image says so.
    proc = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%H", "--", *AGENT_INPUTS],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode == 0:
        assert agent_image.stamp.revision.removesuffix("-dirty") == proc.stdout.strip()
    else:
        assert not (REPO / ".git").exists(), proc.stderr
        assert agent_image.stamp.revision == "unknown"
    proc = podman_run(agent_image, ["--version"])
    assert proc.returncode == 0, proc.stderr
    revision, lock = agent_image.stamp.revision, lockfile.lock_id()
    assert proc.stdout == f"cdi-gen, version {version} (revision {revision}, lock {lock})\n"


def test_image_says_what_it_is_in_its_labels(agent_image: AgentImage) -> None:
    labels = _inspect(agent_image, "{{json .Labels}}")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert {k: v for k, v in labels.items() if k.startswith("org.opencontainers.")} == {
        "org.opencontainers.image.title": project["name"],
        "org.opencontainers.image.description": labels["org.opencontainers.image.description"],
        "org.opencontainers.image.licenses": project["license"],
        "org.opencontainers.image.version": project["version"],
        "org.opencontainers.image.revision": agent_image.stamp.revision,
        "org.opencontainers.image.source": agent_image.stamp.source,
    }
    # The lock it installed (requirements/), as `cdi-gen --version` inside it names it.
    assert labels["io.cdi-gen.lock"] == agent_image.stamp.lock == lockfile.lock_id()
    assert labels["org.opencontainers.image.description"].startswith("Node agent")


def test_image_holds_the_wheel_not_the_source_tree(agent_image: AgentImage) -> None:
    """The package comes from the wheel: installed into the venv's site-packages (not an
    editable link to /src), and no source tree or wheel file is left in the image."""
    code = (
        "import cdi_gen, importlib.metadata as m, os; "
        "d = m.distribution('cdi-gen'); "
        "print(cdi_gen.__file__); print(d.read_text('direct_url.json') or ''); "
        "print(os.path.exists('/src'), os.path.exists('/dist'))"
    )
    proc = podman_run(agent_image, ["-c", code], ["--entrypoint=/opt/cdi-gen/bin/python"])
    assert proc.returncode == 0, proc.stderr
    where, direct_url, leftovers = proc.stdout.splitlines()
    assert where.startswith("/opt/cdi-gen/lib/python3.11/site-packages/cdi_gen/"), where
    assert json.loads(direct_url)["url"].endswith(".whl"), direct_url
    assert leftovers == "False False"


def test_image_accepts_the_shipped_configmap_config(
    agent_image: AgentImage, tmp_path: Path
) -> None:
    config = shipped_config(tmp_path / "config.yaml")
    # Mounted where the DaemonSet mounts the ConfigMap.
    proc = podman_run(
        agent_image,
        ["check-config", "/etc/cdi-gen/config.yaml"],
        [f"--volume={config}:/etc/cdi-gen/config.yaml:ro"],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == (
        "/etc/cdi-gen/config.yaml: OK, vendor example.com, 3 classes: fpga, kvm, serial"
    )


def test_image_rejects_a_bad_config_with_exit_2(agent_image: AgentImage, tmp_path: Path) -> None:
    config = shipped_config(tmp_path / "config.yaml")
    config.write_text(config.read_text().replace("name: fpga", "name: Fpga!"))
    proc = podman_run(
        agent_image,
        ["check-config", "/etc/cdi-gen/config.yaml"],
        [f"--volume={config}:/etc/cdi-gen/config.yaml:ro"],
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(
        "error: /etc/cdi-gen/config.yaml: classes[0].name: invalid class 'Fpga!'"
    ), proc.stderr


def test_image_discovers_host_devices_through_libudev(agent_image: AgentImage) -> None:
    """pyudev loads the image's libudev and reads the host's sysfs, as in the DaemonSet (which
    mounts /sys and /dev read-only); every loop device of the host is found."""
    before = {p.name for p in Path("/sys/class/block").glob("loop*")}
    proc = podman_run(
        agent_image, ["discover", "--json"], ["--volume=/sys:/sys:ro", "--volume=/dev:/dev:ro"]
    )
    after = {p.name for p in Path("/sys/class/block").glob("loop*")}
    assert proc.returncode == 0, proc.stderr
    found = {d["name"] for d in json.loads(proc.stdout)["classes"]["loop"]["devices"]}
    # Other suites add and remove loop devices meanwhile: those present throughout must show.
    present = before & after
    assert present, "the host has no loop device to discover"
    assert present <= found, sorted(present - found)


def test_image_runs_debians_python_and_the_daemonset_command(agent_image: AgentImage) -> None:
    proc = podman_run(
        agent_image,
        ["-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        ["--entrypoint=python3"],
    )
    assert proc.returncode == 0, proc.stderr
    required = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required == ">=3.11" and proc.stdout.strip() == "3.11"
    inspect = subprocess.run(
        agent_image.podman.argv(
            ["image", "inspect", "--format", "{{json .Config}}", agent_image.name]
        ),
        env=agent_image.podman.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    config = json.loads(inspect.stdout)
    assert config["Entrypoint"] == ["cdi-gen"]
    assert config["Cmd"] == ["run"]
