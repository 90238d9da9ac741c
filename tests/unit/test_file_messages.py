"""Messages about a file that may be any file the caller can make us read (``--records``,
``--kubeconfig``) quote a short, redacted fragment of it at most, never its lines (issue 26,
item 15; the config file's own cases are in test_config.py)."""

from __future__ import annotations

import string
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi_gen.apiserver.errors import KubeConfigError
from cdi_gen.apiserver.kubeconfig import load_kubeconfig
from cdi_gen.cli.inputs import load_records_file
from cdi_gen.config.loader import parse_config
from cdi_gen.errors import ConfigError, fragment

SECRET = "$6$Zx8Gq1Lm$SecretHashOfRootUser1234567890"
SHADOW = f"root:{SECRET}:19700:0:99999:7:::\ndaemon:*:19700:0:99999:7:::\n"


def _leaks(message: str) -> bool:
    return any(s in message for s in ("Zx8Gq1Lm", "SecretHash", "$6$"))


RECORD = {"sys_path": "/sys/devices/virtual/block/loop0", "subsystem": "block", "sys_name": "x"}


@pytest.mark.parametrize(
    "content",
    [
        [f"root:{SECRET}"],
        [{**RECORD, "devnode": [SECRET]}],
        [{**RECORD, "major": SECRET}],
        [{**RECORD, "properties": {"PASSWORD": SECRET, "X": 1}}],
        [{**RECORD, "parents": [SECRET]}],
        [{**RECORD, "parents": SECRET}],
        [{**RECORD, "node_exists": SECRET}],
    ],
)
def test_records_errors_quote_no_secret(tmp_path: Path, content: object) -> None:
    path = tmp_path / "records.json"
    path.write_bytes(orjson.dumps(content))
    with pytest.raises(ConfigError) as info:
        load_records_file(path)
    assert "not udev records" in str(info.value)
    assert not _leaks(str(info.value)), str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        SHADOW,  # a mapping of unknown keys
        f"root: {SECRET}:19700:0\n",  # not YAML: the parser quotes the line
        f"apiVersion: v1\nclusters: !<tag:{SECRET}> x\n",  # a tag the parser names
        f"clusters:\n- [{SECRET}\n",
    ],
)
def test_kubeconfig_errors_quote_no_secret(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubeConfigError) as info:
        load_kubeconfig(path)
    assert "not a usable kubeconfig" in str(info.value)
    assert not _leaks(str(info.value)), str(info.value)


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("resyncSecond", "'resyncSecond'"),
        (f"root:{SECRET}", f"'root...' ({5 + len(SECRET)} characters)"),
        ("x" * 30, f"'{'x' * 24}...' (30 characters)"),
        ("$6$", "'...' (3 characters)"),
        (5, "5"),
        (10**4000, "a value of type int"),
        ({"password": SECRET}, "a mapping of 1 key"),
        ([SECRET, SECRET], "a list of 2 items"),
    ],
)
def test_fragment_is_short_and_redacted(value: object, quoted: str) -> None:
    assert fragment(value) == quoted


@given(st.text(max_size=200))
def test_a_fragment_holds_name_characters_only(text: str) -> None:
    quoted = fragment(text)
    allowed = set(string.ascii_letters + string.digits + "_.-' ()")
    assert set(quoted) <= allowed, quoted
    assert len(quoted) <= 24 + len("'...' ( characters)") + len(str(len(text)))


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=40).filter(
            lambda k: (
                k not in ("vendor", "classes", "udevSource", "udev_source")
                and k not in ("resyncSeconds", "resync_seconds")
            )
        ),
        st.text(max_size=40),
        min_size=1,
        max_size=5,
    )
)
def test_a_mapping_without_config_keys_is_named_as_such_and_not_quoted(
    data: dict[str, str],
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "f.json")
    assert str(info.value) == (
        f"f.json: not a cdi-gen config: none of its {len(data)} top-level keys is one of "
        "classes, resyncSeconds, udevSource, vendor"
    )
