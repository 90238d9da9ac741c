"""Whether the agent's exit is an uninstall, asked of the API server about the DaemonSet that
runs the agent; and, when it is, the node's ResourceSlices of our driver deleted.

The agent keeps its spec files (and its slices) when it exits: a restart, a rolling update or
a drain must not break a running pod's next container restart. An uninstall must leave
nothing of ours, so at exit the agent asks about its DaemonSet (``--daemonset``,
``--daemonset-namespace``) within :data:`CHECK_SECONDS`:

- gone (404) or being deleted (``metadata.deletionTimestamp``): an uninstall;
- our credentials refused (401): an uninstall too. The token is bound to the agent's
  ServiceAccount, and ``kubectl delete -k`` deletes the ServiceAccount before the DaemonSet
  (kustomize orders it first), so by the time the agent hears SIGTERM it may not be
  allowed to ask any more;
- anything else (403, another status, no answer in time, a configuration that cannot be
  read, no DaemonSet named): not an uninstall, and the one line logged says why.

The client (and lightkube with it) is imported only when a DaemonSet is named.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from cdi_gen.config.settings import ENV_PREFIX, Settings
from cdi_gen.errors import CdiGenError, quote
from cdi_gen.logs import fields

__all__ = ["CHECK_SECONDS", "SLICES_SECONDS", "Verdict", "ask", "at_exit", "judge"]

log = logging.getLogger("cdi_gen.uninstall")

#: Longest the question may take, from reading the configuration to the answer: well inside
#: the pod's grace period (10 s as shipped), which the spec removal must also fit in.
CHECK_SECONDS = 2.0
#: Longest the deletion of the node's slices may take after an uninstall was found.
SLICES_SECONDS = 3.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether the exit is an uninstall, and why, in words for the log."""

    uninstall: bool
    why: str


def judge(what: str, status: int | None, obj: dict[str, Any] | None, error: str = "") -> Verdict:
    """The verdict on an answer about the DaemonSet ``what``: ``status`` (None: no answer),
    its object when it answered 200, ``error`` the failure in one line (pure)."""
    if status == 200 and obj is not None:
        meta = obj.get("metadata")
        deleting = meta.get("deletionTimestamp") if isinstance(meta, dict) else None
        if deleting:
            return Verdict(True, f"{what} is being deleted (since {quote(deleting)})")
        return Verdict(False, f"{what} is still there: a restart or an update")
    if status == 404:
        return Verdict(True, f"{what} is gone")
    if status == 401:
        return Verdict(
            True,
            f"asking about {what}: our credentials were refused (401): the agent's "
            "ServiceAccount is gone",
        )
    return Verdict(False, f"cannot tell whether {what} is being uninstalled: {error}")


async def ask(settings: Settings, timeout: float = CHECK_SECONDS) -> Verdict:  # noqa: ASYNC109
    """Ask the API server about ``settings.daemonset``, within ``timeout`` seconds in all."""
    if settings.daemonset is None:
        return Verdict(
            False, f"no DaemonSet named (--daemonset, {ENV_PREFIX}DAEMONSET) to ask about"
        )
    from cdi_gen.apiserver.client import ApiClient, ApiServerError

    name = settings.daemonset
    shown = f"DaemonSet {settings.daemonset_namespace or '(namespace of the config)'}/{name}"
    client: ApiClient | None = None

    async def question() -> Verdict:
        nonlocal client, shown
        client = await ApiClient.open(settings.kubeconfig, timeout=timeout)
        namespace = settings.daemonset_namespace or client.namespace
        shown = f"DaemonSet {namespace}/{name}"
        try:
            obj = await client.daemonset(namespace, name)
        except ApiServerError as exc:
            return judge(shown, exc.status, None, str(exc))
        return judge(shown, 200, obj)

    try:
        return await asyncio.wait_for(question(), timeout)
    except TimeoutError:
        return judge(shown, None, None, f"no answer within {timeout:g}s")
    except CdiGenError as exc:  # the configuration cannot be read
        return judge(shown, None, None, str(exc))
    finally:
        if client is not None:
            await client.close()


async def delete_slices(settings: Settings, driver: str, node: str) -> str:
    """Delete the ResourceSlices of ``driver`` on ``node``, within :data:`SLICES_SECONDS`;
    what happened, in words for the log."""
    from cdi_gen.apiserver.client import ApiClient, ApiServerError

    client: ApiClient | None = None

    async def delete() -> int:
        nonlocal client
        client = await ApiClient.open(settings.kubeconfig, timeout=SLICES_SECONDS)
        found = await client.list_slices(driver, node)
        for obj in found:
            await client.delete_slice(obj["metadata"]["name"])
        return len(found)

    # When they cannot be deleted, the kubelet does it: it wipes the slices of a driver
    # that stays unregistered (30 s after the plugin's socket went, in 1.37).
    try:
        count = await asyncio.wait_for(delete(), SLICES_SECONDS)
    except TimeoutError:
        return f"ResourceSlices not deleted within {SLICES_SECONDS:g}s; the kubelet wipes them"
    except (ApiServerError, CdiGenError) as exc:
        return f"ResourceSlices not deleted ({exc}); the kubelet wipes them"
    finally:
        if client is not None:
            await client.close()
    return f"{count} ResourceSlice(s) deleted"


async def at_exit(settings: Settings, driver: str | None) -> bool:
    """Whether this exit is an uninstall (see the module docstring), logged in one line; when
    it is and ``driver`` is given, the node's slices of ``driver`` are deleted first."""
    verdict = await ask(settings)
    if not verdict.uninstall:
        log.info("spec files kept at exit: %s", verdict.why)
        return False
    slices = ""
    if driver is not None:
        node = settings.node()
        slices = "; " + await delete_slices(settings, driver, node)
    log.info(
        "uninstall: %s; removing our spec files%s",
        verdict.why,
        slices,
        extra=fields(reason="uninstall"),
    )
    return True
