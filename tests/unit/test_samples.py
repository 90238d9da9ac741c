"""cdi-samples/ holds specs the tool produced; they must be exactly what it renders now, and
valid under the upstream schema and our rules."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from cdi_gen.cdi.codec import load_spec
from cdi_gen.cli.main import cli, main
from tests.conftest import REPO, upstream_validator

SAMPLES = REPO / "cdi-samples"
SPECS = sorted(SAMPLES.glob("*.json"))


def test_samples_exist() -> None:
    assert {p.name for p in SPECS} == {
        "example.com-fpga.json",
        "example.com-loop.json",
        "example.com-render.json",
    }


@pytest.mark.parametrize("sample", SPECS, ids=lambda p: p.name)
def test_sample_is_what_the_tool_renders(sample: Path, tmp_path: Path) -> None:
    cls = sample.stem.removeprefix("example.com-")
    out = tmp_path / sample.name
    result = CliRunner().invoke(
        cli,
        [
            "render",
            "--config",
            str(SAMPLES / "source" / "config.yaml"),
            "--records",
            str(SAMPLES / "source" / "records.json"),
            "--class",
            cls,
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == sample.read_bytes(), "run cdi-samples/generate.sh"


@pytest.mark.parametrize("sample", SPECS, ids=lambda p: p.name)
def test_sample_is_valid(sample: Path) -> None:
    load_spec(sample.read_bytes())
    upstream_validator().validate(orjson.loads(sample.read_bytes()))


def test_render_sample_needs_host_path_version(capsys: pytest.CaptureFixture[str]) -> None:
    doc = orjson.loads((SAMPLES / "example.com-render.json").read_bytes())
    assert doc["cdiVersion"] == "0.5.0"
    args = [
        "render",
        "--config",
        str(SAMPLES / "source" / "config.yaml"),
        "--records",
        str(SAMPLES / "source" / "records.json"),
        "--class",
        "render",
        "--cdi-version",
        "0.4.0",
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "deviceNodes[0].hostPath: device node hostPath needs cdiVersion 0.5.0" in err
    assert "the target is 0.4.0" in err
