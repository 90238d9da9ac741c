"""Whether the agent's exit is an uninstall, asked of the API server about the DaemonSet that
runs the agent; and, when it is, the node's ResourceSlices of our driver deleted.

The agent keeps its spec files (and its slices) when it exits: a restart, a rolling update or
a drain must not break a running pod's next container restart. An uninstall must leave
nothing of ours, so at exit the agent asks about its DaemonSet (``--daemonset``,
``--daemonset-namespace``) within :data:`CHECK_SECONDS`:

- gone (404) or being deleted (``metadata.deletionTimestamp``): an uninstall;
- our credentials refused (401): an uninstall too. The token is bound to the agent's
  ServiceAccount, and ``kubectl delete -k`` deletes the ServiceAccount (and the RBAC) before
  the DaemonSet (kustomize orders them first), so by the time the agent hears SIGTERM it may
  not be allowed to ask any more;
- refused (403) after this agent has read the DaemonSet before (:meth:`Owner.learn`, at the
  start of a DRA agent): its permission was withdrawn, which is an uninstall as well. The API
  server keeps a token's successful authentication for 10 s
  (``kube-apiserver`` ``TokenSuccessCacheTTL``), so an agent that used its token just before
  the ServiceAccount went is still authenticated, and then refused by the RBAC already gone.
  A device-plugin agent asks nothing before its exit (it loads no API client while it runs),
  so the API server has no authentication of its token kept: it hears 401;
- anything else (403 from an agent that never could read it: the RBAC is wrong; another
  status; no answer in time; a configuration that cannot be read; no DaemonSet named): not an
  uninstall, and the one line logged says why.

The question is asked once, as the agent begins to stop (:meth:`Owner.ask`): a DRA agent being
uninstalled has no successor to hand over to, so it stops serving at once instead of waiting
for one (see :meth:`cdi_gen.dra.plugin.server.DraPlugin.hand_over`). What it answered is logged,
and acted on, once the agent no longer serves (:meth:`Owner.finish`).

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

__all__ = ["CHECK_SECONDS", "SLICES_SECONDS", "Owner", "Verdict", "delete_slices", "judge"]

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


@dataclass(frozen=True, slots=True)
class _Answer:
    what: str
    status: int | None
    obj: dict[str, Any] | None = None
    error: str = ""


def judge(
    what: str,
    status: int | None,
    obj: dict[str, Any] | None,
    error: str = "",
    *,
    read_before: bool = False,
) -> Verdict:
    """The verdict on an answer about the DaemonSet ``what``: ``status`` (None: no answer),
    its object when it answered 200, ``error`` the failure in one line; ``read_before``:
    whether this agent has read it earlier (pure)."""
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
    if status == 403 and read_before:
        return Verdict(
            True,
            f"asking about {what}: refused (403), though this agent read it at start: its "
            "permission was withdrawn (the RBAC is gone)",
        )
    return Verdict(False, f"cannot tell whether {what} is being uninstalled: {error}")


class Owner:
    """The DaemonSet that runs the agent (``settings.cluster.daemonset``), asked about at exit and,
    by a DRA agent, once at start."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: Whether it was read (200) by :meth:`learn`.
        self.read_before = False

    async def _answer(self, timeout: float) -> _Answer:  # noqa: ASYNC109
        """One GET of the DaemonSet, within ``timeout`` seconds in all."""
        from cdi_gen.apiserver.client import ApiClient
        from cdi_gen.apiserver.errors import ApiServerError

        settings = self.settings
        name = settings.cluster.daemonset
        assert name is not None
        namespace = settings.cluster.daemonset_namespace or "(namespace of the config)"
        shown = f"DaemonSet {namespace}/{name}"
        client: ApiClient | None = None

        async def question() -> _Answer:
            nonlocal client, shown
            client = await ApiClient.open(settings.cluster.kubeconfig, timeout=timeout)
            namespace = settings.cluster.daemonset_namespace or client.namespace
            shown = f"DaemonSet {namespace}/{name}"
            try:
                obj = await client.daemonset(namespace, name)
            except ApiServerError as exc:
                return _Answer(shown, exc.status, None, str(exc))
            return _Answer(shown, 200, obj)

        try:
            return await asyncio.wait_for(question(), timeout)
        except TimeoutError:
            return _Answer(shown, None, None, f"no answer within {timeout:g}s")
        except CdiGenError as exc:  # the configuration cannot be read
            return _Answer(shown, None, None, str(exc))
        finally:
            if client is not None:
                await client.close()

    async def learn(self, timeout: float = CHECK_SECONDS) -> None:  # noqa: ASYNC109
        """Read the DaemonSet once now: a 403 at exit then means the permission was
        withdrawn since (see the module docstring)."""
        if self.settings.cluster.daemonset is None:
            return
        answer = await self._answer(timeout)
        self.read_before = answer.status == 200
        if not self.read_before:
            log.warning(
                "cannot read %s (needed to tell an uninstall at exit): %s",
                answer.what,
                answer.error or f"HTTP {answer.status}",
            )

    async def ask(self, timeout: float = CHECK_SECONDS) -> Verdict:  # noqa: ASYNC109
        """Whether this exit is an uninstall, asked now within ``timeout`` seconds."""
        if self.settings.cluster.daemonset is None:
            return Verdict(
                False, f"no DaemonSet named (--daemonset, {ENV_PREFIX}DAEMONSET) to ask about"
            )
        answer = await self._answer(timeout)
        return judge(
            answer.what, answer.status, answer.obj, answer.error, read_before=self.read_before
        )

    async def finish(self, verdict: Verdict, driver: str | None) -> bool:
        """After the agent stopped serving: ``verdict`` (from :meth:`ask`) logged in one line;
        when it is an uninstall and ``driver`` is given, the node's slices of ``driver`` are
        deleted. Whether it is an uninstall (the spec files are then removed)."""
        if not verdict.uninstall:
            log.info("spec files kept at exit: %s", verdict.why)
            return False
        slices = ""
        if driver is not None:
            slices = "; " + await delete_slices(self.settings, driver, self.settings.node())
        log.info(
            "uninstall: %s; removing our spec files%s",
            verdict.why,
            slices,
            extra=fields(reason="uninstall"),
        )
        return True


async def delete_slices(settings: Settings, driver: str, node: str) -> str:
    """Delete the ResourceSlices of ``driver`` on ``node``, within :data:`SLICES_SECONDS`;
    what happened, in words for the log."""
    from cdi_gen.apiserver.client import ApiClient
    from cdi_gen.apiserver.errors import ApiServerError

    client: ApiClient | None = None

    async def delete() -> int:
        nonlocal client
        client = await ApiClient.open(settings.cluster.kubeconfig, timeout=SLICES_SECONDS)
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
