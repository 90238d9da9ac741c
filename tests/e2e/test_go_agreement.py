"""cdi-gen's validator and registry view against the Go CDI library the runtimes embed.

The reference is Debian's Go CDI library 0.5.2 (the one in podman 4.3), queried through
tests/e2e/cdicheck. cdi-gen follows the current CDI rules, so some verdicts differ on purpose;
every such file is listed in DIVERGENCES with the reason, and the test fails if the libraries
ever stop diverging there (so the table cannot go stale). Verdicts where cdi-gen is laxer than
the Go library without a spec reason are cdi-gen bugs: they are in CDI_GEN_BUGS as strict
xfails, so they show up in every run and flip to a failure once fixed.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from consumers import REPO, GoCDI, Json, cdi_gen

BAD = REPO / "tests" / "data" / "cdi-bad"
SAMPLES = REPO / "cdi-samples"
BAD_FILES = sorted(p for p in BAD.iterdir() if p.suffix in (".json", ".yaml"))


@dataclass(frozen=True)
class Verdicts:
    go: str  # "ok", "error" or "panic"
    ours: str  # "ok" or "error"


@dataclass(frozen=True)
class Divergence:
    go: str
    ours: str
    reason: str


# Files of tests/data/cdi-bad that do not get ("error", "error"). Keep the reasons precise:
# they are the project's record of where Go CDI 0.5.2 and the current rules part ways.
DIVERGENCES: dict[str, Divergence] = {
    # --- Go 0.5.2 is stricter: it predates these spec versions and their fields ---
    "version-0.6.0-annotations.json": Divergence(
        "error", "ok", "annotations/cdiVersion 0.6.0 are valid today; 0.5.2 knows neither"
    ),
    "additional-gids-0.7.0.json": Divergence(
        "error", "ok", "additionalGids arrived in 0.7.0; 0.5.2 rejects it as unknown field"
    ),
    "version-1.1.0-unknown-to-go.json": Divergence(
        "error", "ok", "1.1.0 is a known version today; 0.5.2 knows up to 0.5.0"
    ),
    "version-v-prefix.json": Divergence(
        "error",
        "ok",
        "libraries >= 0.5.4 strip a leading 'v'; 0.5.2 needs the exact string "
        "(so podman 4.3 refuses such a file: never emit the 'v')",
    ),
    # --- Go 0.5.2 is laxer than the current rules ---
    "devices-empty.json": Divergence(
        "ok", "error", "0.5.2 has no 'no devices' check; later libraries reject such specs"
    ),
    "devices-missing.json": Divergence(
        "ok", "error", "same as devices-empty: a spec without devices is accepted by 0.5.2"
    ),
    "version-too-low-hostpath.json": Divergence(
        "ok", "error", "0.5.2 only checks the version is known, not that it covers the fields"
    ),
    "version-too-low-mount-type.json": Divergence(
        "ok", "error", "mount type needs 0.4.0; 0.5.2 does not compute a minimum version"
    ),
    "version-too-low-digit-name.json": Divergence(
        "ok", "error", "a leading digit in a device name needs 0.5.0; 0.5.2 does not check"
    ),
    "devicenode-path-relative.json": Divergence(
        "ok", "error", "0.5.2 only checks the path is non-empty; we require absolute paths"
    ),
    "mount-containerpath-relative.json": Divergence(
        "ok", "error", "0.5.2 only checks non-empty; a relative containerPath is meaningless"
    ),
    "hook-path-relative.json": Divergence(
        "ok", "error", "SPEC: hook path is absolute; 0.5.2 only checks non-empty"
    ),
    "hook-timeout-zero.json": Divergence(
        "ok", "error", "SPEC/OCI: timeout must be > 0 when set; 0.5.2 does not check it"
    ),
    "hook-timeout-negative.json": Divergence(
        "ok", "error", "as hook-timeout-zero: 0.5.2 takes any integer"
    ),
    "version-0.1.0.json": Divergence(
        "ok",
        "error",
        "0.5.2 knows 0.1.0 and takes it; later libraries require at least 0.3.0, the first "
        "tagged spec, for every file",
    ),
    # Go reads every file, .json included, with a YAML parser (sigs.k8s.io/yaml; still so in
    # CDI 1.x), so YAML syntax inside a .json file is fine for the runtimes. cdi-gen parses
    # .json as JSON. Consequence: `cdi-gen list` omits devices of such files that a runtime
    # would still use; cdi-gen itself never writes them.
    "json-with-comment.json": Divergence("ok", "error", "'# ...' is a YAML comment"),
    "json-trailing-garbage.json": Divergence(
        "ok", "error", "the YAML parser stops after the first flow mapping"
    ),
    "yaml-multi-doc.yaml": Divergence(
        "ok", "error", "0.5.2 reads the first YAML document and ignores the rest"
    ),
    "devicenode-major-float.json": Divergence(
        "ok", "error", "YAML-to-JSON turns 7.0 into 7 before Go decodes the integer"
    ),
    "unknown-field-case.json": Divergence(
        "ok",
        "error",
        "Go's encoding/json matches field names case-insensitively, so 'CDIVersion' passes "
        "0.5.2's strict decoding; the schema's names are case-sensitive",
    ),
    # --- Go 0.5.2 crashes ---
    "kind-vendor-one-char.json": Divergence(
        "panic", "error", "0.5.2 slices vendor[1:0] and panics (podman 4.3 and containerd crash)"
    ),
    "kind-class-one-char.json": Divergence(
        "panic", "error", "0.5.2 slices class[1:0] and panics (podman 4.3 and containerd crash)"
    ),
    "devicenode-null-item.json": Divergence(
        "panic", "error", "0.5.2 dereferences the nil *DeviceNode of `deviceNodes: [null]`"
    ),
}

# cdi-gen accepts these although every CDI version (and the Go library) rejects them.
CDI_GEN_BUGS: dict[str, str] = {}


def _go_verdict(result: Json) -> str:
    if result.get("panic"):
        return "panic"
    return "ok" if result["ok"] else "error"


def _our_problems(paths: list[Path]) -> tuple[int, dict[Path, list[str]]]:
    """Run ``cdi-gen validate`` once and split its problem lines by file."""
    proc = cdi_gen("validate", "-q", *paths)
    problems: dict[Path, list[str]] = {p: [] for p in paths}
    for line in proc.stdout.splitlines() + proc.stderr.splitlines():
        for p in paths:
            if line.startswith(f"{p}: "):
                problems[p].append(line[len(f"{p}: ") :])
                break
    return proc.returncode, problems


@dataclass(frozen=True)
class Corpus:
    exit_code: int  # of one `cdi-gen validate` over the whole corpus
    problems: dict[Path, list[str]]
    verdicts: dict[str, Verdicts]


@pytest.fixture(scope="module")
def corpus(go_cdi: GoCDI) -> Corpus:
    go = go_cdi.validate(*BAD_FILES)
    rc, ours = _our_problems(BAD_FILES)
    verdicts = {
        p.name: Verdicts(_go_verdict(go[str(p)]), "error" if ours[p] else "ok") for p in BAD_FILES
    }
    return Corpus(rc, ours, verdicts)


def test_corpus_and_tables_are_consistent() -> None:
    names = {p.name for p in BAD_FILES}
    assert len(names) >= 40
    assert set(DIVERGENCES) <= names, set(DIVERGENCES) - names
    assert set(CDI_GEN_BUGS) <= names, set(CDI_GEN_BUGS) - names
    assert not set(DIVERGENCES) & set(CDI_GEN_BUGS)


@pytest.mark.parametrize("name", [p.name for p in BAD_FILES])
def test_bad_spec_verdicts_agree_or_divergence_is_documented(
    name: str, corpus: Corpus, request: pytest.FixtureRequest
) -> None:
    if name in CDI_GEN_BUGS:
        request.applymarker(pytest.mark.xfail(reason=CDI_GEN_BUGS[name], strict=True))
    got = corpus.verdicts[name]
    expected = DIVERGENCES.get(name, Divergence("error", "error", "both reject"))
    assert (got.go, got.ours) == (expected.go, expected.ours), expected.reason


# Files that are invalid under the current rules, so cdi-gen must explain why.
INVALID_TODAY = [
    p
    for p in BAD_FILES
    if p.name not in CDI_GEN_BUGS
    and DIVERGENCES.get(p.name, Divergence("", "error", "")).ours == "error"
]


def test_validate_exits_1_on_the_corpus(corpus: Corpus) -> None:
    assert corpus.exit_code == 1


@pytest.mark.parametrize("path", INVALID_TODAY, ids=lambda p: p.name)
def test_our_problem_lines_name_the_file_and_a_reason(path: Path, corpus: Corpus) -> None:
    assert corpus.problems[path], f"no line starting with '{path}: '"
    for msg in corpus.problems[path]:
        assert len(msg.strip()) > 10, msg


# ---------------------------------------------------------------------------------------------
# Folders: devices, conflicts, shadowing, per-file errors


def _spec(kind: str, *names: str, env: str = "A=1") -> Json:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"env": [env]}} for n in names],
    }


def _write(folder: Path, name: str, doc: Json) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(doc))
    return path


def _ours_list(*dirs: Path) -> Json:
    args: list[str | Path] = ["list", "--json"]
    for d in dirs:
        args += ["--spec-dir", d]
    proc = cdi_gen(*args)
    assert proc.returncode == 0, proc.stderr
    view: Json = json.loads(proc.stdout)
    return view


def _assert_same_view(go_cdi: GoCDI, *dirs: Path) -> Json:
    go = go_cdi.list(*dirs)
    assert not go.get("panic"), go["panic"]
    ours = _ours_list(*dirs)
    assert ours["devices"] == go["devices"]
    assert sorted(ours["conflicts"]) == go["conflicts"]
    assert set(ours["errors"]) == set(go["errors"])
    return ours


def test_conflict_in_one_folder_drops_the_device(go_cdi: GoCDI, tmp_path: Path) -> None:
    d = tmp_path / "d"
    a = _write(d, "a.json", _spec("example.com/loop", "l0", "l1"))
    b = _write(d, "b.json", _spec("example.com/loop", "l0", "l2"))
    ours = _assert_same_view(go_cdi, d)
    assert ours["devices"] == {"example.com/loop=l1": str(a), "example.com/loop=l2": str(b)}
    assert set(ours["conflicts"]) == {"example.com/loop=l0"}
    assert set(ours["errors"]) == {str(a), str(b)}


def test_later_folder_shadows_earlier(go_cdi: GoCDI, tmp_path: Path) -> None:
    static, dynamic = tmp_path / "etc", tmp_path / "run"
    _write(static, "x.json", _spec("example.com/loop", "l0", "l1"))
    winner = _write(dynamic, "y.json", _spec("example.com/loop", "l0"))
    ours = _assert_same_view(go_cdi, static, dynamic)
    assert ours["devices"]["example.com/loop=l0"] == str(winner)
    assert not ours["conflicts"]
    # The same folders the other way round: the other file wins.
    reverse = _assert_same_view(go_cdi, dynamic, static)
    assert reverse["devices"]["example.com/loop=l0"] == str(static / "x.json")


@pytest.mark.parametrize("conflict_in", ["lower", "higher"])
def test_conflict_in_any_folder_drops_the_device_everywhere(
    go_cdi: GoCDI, tmp_path: Path, conflict_in: str
) -> None:
    """The library deletes a conflicting name at the end of the scan, even when another folder
    of higher priority defines it too: a runtime then cannot resolve the name at all."""
    low, high = tmp_path / "low", tmp_path / "high"
    pair, single = (low, high) if conflict_in == "lower" else (high, low)
    _write(pair, "a.json", _spec("example.com/loop", "l0"))
    _write(pair, "b.json", _spec("example.com/loop", "l0"))
    _write(single, "c.json", _spec("example.com/loop", "l0", "l9"))
    ours = _assert_same_view(go_cdi, low, high)
    assert "example.com/loop=l0" not in ours["devices"]
    assert "example.com/loop=l9" in ours["devices"]


def test_only_json_and_yaml_at_top_level_are_read(go_cdi: GoCDI, tmp_path: Path) -> None:
    d = tmp_path / "d"
    _write(d, "kept.yaml", _spec("example.com/loop", "yaml0"))
    _write(d, "ignored.yml", _spec("example.com/loop", "yml0"))
    _write(d, "ignored.json~", _spec("example.com/loop", "tilde0"))
    _write(d / "sub", "nested.json", _spec("example.com/loop", "nested0"))
    ours = _assert_same_view(go_cdi, d)
    assert set(ours["devices"]) == {"example.com/loop=yaml0"}


def test_folder_of_broken_specs_next_to_good_ones(go_cdi: GoCDI, tmp_path: Path) -> None:
    """The whole corpus in one folder: broken files are skipped one by one, never the folder."""
    d = tmp_path / "d"
    d.mkdir()
    for p in BAD_FILES:
        expected = DIVERGENCES.get(p.name)
        if expected is not None and "panic" in (expected.go, expected.ours):
            continue  # one such file takes the whole Go registry down; tested above per file
        if expected is not None and "ok" in (expected.go, expected.ours):
            continue  # would define example.com/loop=loop0 in one view only
        if p.name in CDI_GEN_BUGS:
            continue
        shutil.copy(p, d / p.name)
    good = _write(d, "good.json", _spec("example.com/other", "g0"))
    ours = _assert_same_view(go_cdi, d)
    assert ours["devices"] == {"example.com/other=g0": str(good)}
    assert len(ours["errors"]) >= 35


# ---------------------------------------------------------------------------------------------
# cdi-samples/


def _samples() -> list[Path]:
    return sorted(p for p in SAMPLES.glob("*") if p.suffix in (".json", ".yaml"))


def test_there_are_samples() -> None:
    assert _samples(), f"no samples in {SAMPLES}"


@pytest.mark.parametrize("sample", _samples(), ids=lambda p: p.name)
def test_sample_verdicts_agree(sample: Path, go_cdi: GoCDI) -> None:
    """Every sample is valid today; the Go library 0.5.2 accepts it unless it needs a newer
    cdiVersion than 0.5.0, which it then refuses by version or by a field it does not know."""
    rc, ours = _our_problems([sample])
    assert rc == 0 and not ours[sample], ours[sample]
    go = go_cdi.validate(sample)[str(sample)]
    version = _cdi_version(sample)
    if _version_tuple(version) <= (0, 5, 0):
        assert go["ok"], go
    else:
        assert not go["ok"], f"0.5.2 accepted cdiVersion {version}?"


def _cdi_version(path: Path) -> str:
    import yaml

    return str(yaml.safe_load(path.read_text())["cdiVersion"])


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.lstrip("v").split("."))


def test_samples_folder_view_agrees(go_cdi: GoCDI) -> None:
    ours = _assert_same_view(go_cdi, SAMPLES)
    assert ours["devices"], "the samples define no device?"
    assert not ours["errors"]
