"""docs/examples/ (the cookbook) holds, per scenario, a config, recorded udev data, the specs
they render and the pod or claim that uses them: each spec must be exactly what the tool
renders now, and each consumer must ask for what the config's classes offer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cdi_gen.config.loader import load_config
from cdi_gen.dra.driver.deviceclasses import device_class_name
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
