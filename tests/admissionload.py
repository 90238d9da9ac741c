"""Load on a real ``cdi-gen admission`` process: many TLS clients posting large bodies at
once, and the process's peak memory read from /proc. Shared by
tests/integration/test_admission_limits.py and benchmarks/bench_admission.py.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port
from tests.waiting import until_sync

DRIVER = "example.com"
PATH = "/validate-resource-claim-parameters"
MIB = 1 << 20


def review_body(size: int) -> bytes:
    """A valid AdmissionReview of a claim of ``size`` bytes (a long annotation): allowed,
    and cheap to decode (one string)."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "CREATE",
            "object": {
                "kind": "ResourceClaim",
                "metadata": {"name": "c", "annotations": {"a": ""}},
                "spec": {"devices": {"config": []}},
            },
        },
    }
    empty = len(json.dumps(review))
    review["request"]["object"]["metadata"]["annotations"]["a"] = "x" * (size - empty)  # type: ignore[index]
    body = json.dumps(review).encode()
    assert len(body) == size
    return body


def bomb_body(size: int) -> bytes:
    """JSON of ``size`` bytes that decodes to the most objects: ``[{},{},...]``, an empty
    dict (64 bytes and a list slot) for every 3 bytes."""
    count = (size - 1) // 3
    body = b"[" + b"{}," * (count - 1) + b"{}]"
    return body + b" " * (size - len(body))


def _post(port: int, ca: Path, body: bytes) -> int | str:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=120)
    try:
        conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def flood(port: int, ca: Path, bodies: Sequence[bytes]) -> list[int | str]:
    """Post every body at once, one client thread each; each one's status, or its error."""
    results: list[int | str] = ["not answered"] * len(bodies)

    def one(index: int) -> None:
        results[index] = _post(port, ca, bodies[index])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def _healthz(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextmanager
def admission_process(
    cert: Path, key: Path, ca: Path, *args: str
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``cdi-gen admission`` as the Deployment runs it (with ``args`` added), answering
    /healthz; stopped after."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdi_gen", "admission", "--driver", DRIVER,
         "--address", f"127.0.0.1:{port}", "--tls-cert-file", str(cert),
         "--tls-key-file", str(key), *args],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def serving() -> bool:
            assert proc.poll() is None, "cdi-gen admission exited"
            return _healthz(port, ca)

        until_sync(serving, "cdi-gen admission answering /healthz", 30)
        yield proc, port
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def keys_body(values: int) -> bytes:
    """The JSON that decodes to the most memory for its count of values: one object of
    ``values`` distinct keys (a string and a slot of the object's table each)."""
    return b"{" + b",".join(b'"k%07d":0' % i for i in range(values)) + b"}"
