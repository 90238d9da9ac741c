"""The grpc experiment cdi-gen turns off is still one the installed grpcio knows.

``GRPC_EXPERIMENTS`` names experiments; grpc only logs a name it does not know, so a name
dropped by a later grpcio would silently cost the speed it bought. Each case runs in a fresh
interpreter, since grpc reads the variable once, when it is first imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cdi_gen.kubelet import GRPC_EXPERIMENTS

# Serve and call one unary RPC, so that grpc's core has read its configuration.
_SERVE_AND_CALL = """
import concurrent.futures, os, sys
import cdi_gen.kubelet
cdi_gen.kubelet.apply_grpc_experiments()
import grpc
print(os.environ.get("GRPC_EXPERIMENTS", ""))
socket = sys.argv[1]
echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
server = grpc.server(concurrent.futures.ThreadPoolExecutor(2), handlers=[
    grpc.method_handlers_generic_handler("t.T", {"Echo": echo})])
server.add_insecure_port("unix://" + socket)
server.start()
with grpc.insecure_channel("unix://" + socket) as channel:
    call = channel.unary_unary("/t.T/Echo", request_serializer=None, response_deserializer=None)
    assert call(b"ping", timeout=10) == b"ping"
server.stop(0)
"""


def _run(short_dir: Path, experiments: str | None, code: str = _SERVE_AND_CALL) -> tuple[str, str]:
    env = dict(os.environ)
    env.pop("GRPC_EXPERIMENTS", None)
    if experiments is not None:
        env["GRPC_EXPERIMENTS"] = experiments
    done = subprocess.run(
        [sys.executable, "-c", code, str(short_dir / "t.sock")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip(), done.stderr


def test_the_installed_grpcio_accepts_the_experiment_we_turn_off(short_dir: Path) -> None:
    value, stderr = _run(short_dir, None)
    assert value == GRPC_EXPERIMENTS == "-event_engine_listener"
    assert "Unknown experiment" not in stderr, stderr


def test_an_unknown_experiment_is_what_grpc_reports(short_dir: Path) -> None:
    # The check above can fail: grpc names an experiment it does not know.
    value, stderr = _run(short_dir, "-cdi_gen_no_such_experiment")
    assert value == "-cdi_gen_no_such_experiment,-event_engine_listener"
    assert "Unknown experiment: cdi_gen_no_such_experiment" in stderr, stderr
    assert "Unknown experiment: event_engine_listener" not in stderr


def test_an_operators_choice_for_the_experiment_wins(short_dir: Path) -> None:
    value, stderr = _run(short_dir, "event_engine_listener")
    assert value == "event_engine_listener"
    assert "Unknown experiment" not in stderr


def test_importing_the_kubelet_package_leaves_the_environment_alone(short_dir: Path) -> None:
    # The agent imports it for the device boards even when no class is served by a plugin.
    code = (
        "import os, cdi_gen.kubelet, cdi_gen.agent.agent\n"
        "print(os.environ.get('GRPC_EXPERIMENTS', '-'))"
    )
    value, _ = _run(short_dir, None, code)
    assert value == "-"


def test_cdi_gen_run_sets_it_first(short_dir: Path) -> None:
    # Before its settings are read: a refused flag still leaves the setting made.
    code = (
        "import os\n"
        "from cdi_gen.cli.main import main\n"
        "try:\n"
        "    main(['run', '--spec-dir', ''])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(os.environ.get('GRPC_EXPERIMENTS', '-'))"
    )
    value, _ = _run(short_dir, None, code)
    assert value.splitlines()[-1] == GRPC_EXPERIMENTS


def test_nothing_is_set_once_grpc_is_loaded(short_dir: Path) -> None:
    code = (
        "import os, grpc, cdi_gen.kubelet\n"
        "print(os.environ.get('GRPC_EXPERIMENTS', '-'), cdi_gen.kubelet.apply_grpc_experiments())"
    )
    value, _ = _run(short_dir, None, code)
    assert value == "- False"
