"""``replace_node``: a device node made, or its stale node replaced, inside a running
container, by a short-lived child process of the same interpreter
(:mod:`~cdi_gen.containernode.inside`), so that no thread of the agent ever changes its mount
namespace. Blocking (one process start, about 20 ms: benchmarks/bench_containernode.py): the
agent calls it from a worker thread.

A container's own problem (it exited, its PID went to another process, it planted a link or a
file at the path) is a :class:`~cdi_gen.containernode.node.NodeResult` with one logged line,
never an exception: the agent serves on.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from cdi_gen.containernode.node import ContainerProcess, DeviceNode, NodeResult, Status

__all__ = ["CHILD", "replace_node"]

log = logging.getLogger(__name__)

#: The folder that holds the ``cdi_gen`` package (site-packages, or ``src`` in a checkout).
_PACKAGES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The child: isolated (``-I``: no environment variables, no user site, not the agent's
#: working folder on its import path) and without ``site`` (``-S``: no ``.pth`` files run),
#: which halves its start; the package's folder is put on its path by hand.
CHILD = (
    sys.executable,
    "-I",
    "-S",
    "-c",
    f"import sys; sys.path.insert(0, {_PACKAGES!r}); "
    "from cdi_gen.containernode.inside import main; sys.exit(main(sys.argv[1:]))",
)
#: A child that does not answer within this (a file system that hangs) is killed.
TIMEOUT = 10.0
#: Most bytes of the child's error output quoted.
_STDERR_QUOTE = 200
_STATUSES: dict[str, Status] = {"done": "done", "skipped": "skipped", "refused": "refused"}


def _answer(stdout: str) -> tuple[Status, str] | None:
    """The child's answer line, or None when it printed none that is whole."""
    lines = stdout.splitlines()
    if len(lines) != 1:
        return None
    word, _, reason = lines[0].partition(" ")
    status = _STATUSES.get(word)
    return None if status is None else (status, reason)


def replace_node(
    process: ContainerProcess, node: DeviceNode, *, timeout: float = TIMEOUT
) -> NodeResult:
    """Make ``node`` at its path inside the container of ``process``, replacing the stale
    device node there; the result, logged in one line unless done."""
    problem = node.problem()
    if problem is not None:
        return _logged(NodeResult("refused", problem, process.pid, node.path))
    arguments = [str(process.pid), str(process.start), *node.as_arguments()]
    try:
        child = subprocess.run(
            [*CHILD, *arguments], stdin=subprocess.DEVNULL, capture_output=True,
            text=True, errors="replace", timeout=timeout, env={}, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        reason = f"the child process gave no answer within {timeout:g} s and was killed"
        return _logged(NodeResult("refused", reason, process.pid, node.path))
    answer = _answer(child.stdout)
    if answer is None:
        last = (child.stderr.strip().splitlines() or [""])[-1][:_STDERR_QUOTE]
        reason = f"the child process exited {child.returncode} with no answer: {last!r}"
        return _logged(NodeResult("refused", reason, process.pid, node.path))
    status, reason = answer
    return _logged(NodeResult(status, reason, process.pid, node.path))


def _logged(result: NodeResult) -> NodeResult:
    if not result.done:
        log.warning("%s", result.line)
    return result
