"""Proves the README's first command: `make run` sets up and starts the agent on the embedded
catalogue, which then registers every class that has devices with a kubelet and answers
``/readyz`` 200. Run by .ci/run from the isolated clone; exits non-zero with the reason and the
agent's output when it does not.

The kubelet is the suite's fake one (a real Registration server on a real unix socket), in a
private device-plugin folder, and the specs go to a private folder, so the smoke run touches
nothing of the machine's: only the paths change, through the agent's own environment variables.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fakes.kubelet import FakeKubelet  # noqa: E402  (needs the repository on sys.path)
from tests.ports import free_port  # noqa: E402

#: `make run` may first install the package; after that the agent is ready in about a second.
READY_WITHIN = 180.0


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


async def _smoke(folder: Path) -> int:
    port = free_port()
    env = {
        **os.environ,
        "CDI_GEN_SPEC_DIR": str(folder / "cdi"),
        "CDI_GEN_DEVICE_PLUGIN_DIR": str(folder / "dp"),
        "CDI_GEN_METRICS_ADDRESS": f"127.0.0.1:{port}",
    }
    log = folder / "make-run.log"
    async with FakeKubelet(folder / "dp") as kubelet:
        with log.open("wb") as out:
            # A session of its own, so the stop reaches make and the agent it started.
            make = await asyncio.create_subprocess_exec(
                "make",
                "--no-print-directory",
                "run",
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = time.monotonic()
        status, body = 0, ""
        try:
            while time.monotonic() - started < READY_WITHIN and make.returncode is None:
                # In a thread: the fake kubelet answers Register on this event loop.
                status, body = await asyncio.to_thread(_readyz, port)
                if status == 200:
                    break
                await asyncio.sleep(0.25)
        finally:
            if make.returncode is None:
                os.killpg(make.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(make.wait(), 30)
            except TimeoutError:
                os.killpg(make.pid, signal.SIGKILL)
                await make.wait()
        registered: list[str] = []
        while not kubelet.registered.empty():
            registered.append(kubelet.registered.get_nowait().request.resource_name)
        registered.sort()
    output = log.read_text(errors="replace")
    if status != 200:
        print(f"make run: /readyz never answered 200 within {READY_WITHIN:.0f} s", file=sys.stderr)
        print(f"last answer: {status} {body.strip()}", file=sys.stderr)
        print(f"make exited {make.returncode}; its output:\n{output}", file=sys.stderr)
        return 1
    specs = sorted(p.name for p in (folder / "cdi").glob("*.json"))
    print(f"make run: /readyz 200 after {time.monotonic() - started:.1f} s")
    print(f"registered with the kubelet: {', '.join(registered)}")
    print(f"spec files: {', '.join(specs)}")
    if not registered or not specs:
        print("make run: ready, but nothing registered or written", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="cg"))
    try:
        return asyncio.run(_smoke(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
