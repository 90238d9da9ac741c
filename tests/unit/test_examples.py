"""docs/examples/ (the cookbook) holds, per scenario, a config, recorded udev data, the specs
they render and the pod or claim that uses them: each spec must be exactly what the tool
renders now, and each consumer must ask for what the config's classes offer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from cdi_gen.agent.whenback import ContainerOutcome
from cdi_gen.config.loader import load_config
from cdi_gen.dra.driver.deviceclasses import device_class_name
from cdi_gen.metrics import Metrics
from tests.examples import EXAMPLES, Example, examples, render, scenarios

FILES = ("README.md", "config.yaml", "records.json")


@pytest.mark.parametrize("example", examples(), ids=lambda e: f"{e.folder.name}/{e.cls}")
def test_spec_is_what_the_tool_renders(example: Example) -> None:
    code, out, err = render(example)
    assert code == 0, err
    assert example.spec.exists(), f"{example.spec} is missing: run docs/examples/render.sh"
    assert out == example.spec.read_bytes(), (
        f"{example.spec} differs from what cdi-gen renders: run docs/examples/render.sh"
    )


@pytest.mark.parametrize("folder", scenarios(), ids=lambda p: p.name)
def test_folder_has_its_files(folder: Path) -> None:
    missing = [name for name in FILES if not (folder / name).is_file()]
    assert not missing, f"{folder.name} lacks {missing}"
    assert (folder / "pod.yaml").is_file() or (folder / "claim.yaml").is_file()
    wanted = {e.spec.name for e in examples() if e.folder == folder}
    assert {p.name for p in folder.glob("spec*.json")} == wanted


@pytest.mark.parametrize("folder", scenarios(), ids=lambda p: p.name)
def test_config_validates(folder: Path) -> None:
    load_config(folder / "config.yaml")


def _consumers(folder: Path) -> list[dict[str, object]]:
    docs = []
    for name in ("pod.yaml", "claim.yaml"):
        path = folder / name
        if path.is_file():
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def _asked(doc: dict[str, object]) -> tuple[set[str], set[str]]:
    """The extended resources a Pod's (or a Deployment's pods') containers ask for, the
    DeviceClasses a claim names."""
    resources: set[str] = set()
    classes: set[str] = set()
    spec = doc.get("spec")
    assert isinstance(spec, dict)
    if doc["kind"] == "Deployment":  # its pods' template is a Pod's
        spec = spec["template"]["spec"]
        assert isinstance(spec, dict)
        doc = {"kind": "Pod"}
    if doc["kind"] == "Pod":
        for c in spec["containers"]:
            resources |= set(c.get("resources", {}).get("limits", {}))
    else:
        assert doc["apiVersion"] == "resource.k8s.io/v1"
        inner = spec["spec"] if doc["kind"] == "ResourceClaimTemplate" else spec
        classes |= {r["exactly"]["deviceClassName"] for r in inner["devices"]["requests"]}
    return resources, classes


@pytest.mark.parametrize("folder", scenarios(), ids=lambda p: p.name)
def test_consumers_ask_for_what_the_config_offers(folder: Path) -> None:
    config = load_config(folder / "config.yaml")
    offered = {f"{config.vendor}/{c.name}" for c in config.classes}
    dra = {device_class_name(c.name, config.vendor) for c in config.classes if c.api == "dra"}
    docs = _consumers(folder)
    assert docs, f"{folder.name}: no pod or claim"
    asked_resources: set[str] = set()
    asked_classes: set[str] = set()
    for doc in docs:
        resources, classes = _asked(doc)
        asked_resources |= resources
        asked_classes |= classes
    assert asked_resources <= offered, f"{folder.name}: asks for {asked_resources - offered}"
    assert asked_classes <= dra, f"{folder.name}: no DRA class {asked_classes - dra}"
    assert asked_resources or asked_classes


def test_table_lists_exactly_the_folders() -> None:
    text = (EXAMPLES / "README.md").read_text()
    linked = set(re.findall(r"^\| \[[^\]]+\]\(([a-z0-9-]+)/\)", text, re.MULTILINE))
    assert linked == {p.name for p in scenarios()}


def _when_back(folder: Path) -> list[tuple[str, str]]:
    """(class, whenBack) of ``folder``'s classes that do something when a device comes back."""
    doc = yaml.safe_load((folder / "config.yaml").read_text())
    return [
        (c["name"], c["whenBack"]) for c in doc["classes"] if c.get("whenBack", "keep") != "keep"
    ]


@pytest.mark.parametrize("folder", [f for f in scenarios() if _when_back(f)], ids=lambda p: p.name)
def test_a_when_back_scenario_shows_what_a_user_sees(folder: Path) -> None:
    """The README quotes the agent's line and metric for the scenario's device, pod and
    policy as the agent writes them; the pod is one the kubelet starts again (a follow
    without its privileges runs as restart)."""
    readme = (folder / "README.md").read_text()
    vendor = load_config(folder / "config.yaml").vendor
    pod = next(d for d in _consumers(folder) if d["kind"] == "Pod")
    spec = pod["spec"]
    assert isinstance(spec, dict)
    assert spec.get("restartPolicy", "Always") != "Never", f"{folder.name}: restartPolicy Never"
    where = f"default/{pod['metadata']['name']}/{spec['containers'][0]['name']}"  # type: ignore[index]
    for cls, policy in _when_back(folder):
        example = next(e for e in examples() if e.folder == folder and e.cls == cls)
        device = json.loads(example.spec.read_text())["devices"][0]["name"]
        outcome = "done" if policy == "follow" else "restarted"
        resource = f"{vendor}/{cls}"
        line = ContainerOutcome(where, "", outcome, "").line(resource, device)
        assert f"`{line}: " in readme, f"{folder.name}: README lacks the line {line!r}"
        labels = f'resource="{resource}",policy="{policy}",outcome="{outcome}"'
        metric = f"{Metrics().when_back._name}_total{{{labels}}}"
        assert metric in readme, f"{folder.name}: README lacks {metric}"
