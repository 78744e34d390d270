"""High availability (`--leader-elect`): only the Lease holder runs the controller; every replica serves the webhook.

A standby drops its GRPOJob watch's events (it caches nothing and starts none of the pod watch, resync, scraper or work
queue: `Controller.ensure_background` is reached only through an admitted event or `Controller.start_leading`; the
gate is the writer's, writer.py). On acquiring the Lease, the new leader re-lists every GRPOJob in its scope before
acting (relist), so it never acts on a cache older than its lease; the pod watch lists the pods before any reconcile
(podwatch.py). Losing the Lease ends the process (leader.py), so there is no way back from leader to standby with
stale state. The elector runs on a thread and event loop of its own: the operator's loop also serves the webhook,
whose load a tenant chooses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..webhook.loopthread import LoopThread, run_on
from . import kube as kube_mod
from . import leader
from .jobwatch import as_job, job_scopes
from .listwatch import list_pages
from .settings import Settings

log = logging.getLogger("grpo_operator.ha")


class Gate:
    """Whether this replica's controller may act; with leader election off it always may."""

    def __init__(self, leader_elect: bool):
        self.active = not leader_elect
        self.relisting = False
        self.deleted_meanwhile: set[str] = set()  # uids deleted while the re-list was in flight


def admit_event(gate: Gate, event: Any, body: dict[str, Any]) -> bool:
    """The hook at the top of the GRPOJob event handler (handlers.Controller.job_event): False on a standby (drop the
    event)."""
    if not gate.active:
        return False
    if gate.relisting and event.get("type") == "DELETED":
        gate.deleted_meanwhile.add((body.get("metadata") or {}).get("uid", ""))
    return True


async def list_jobs(kube: kube_mod.Kube, cfg: Settings) -> list[dict[str, Any]]:
    """Every GRPOJob in the operator's scopes: the job watch's paths, its namespace filter for globs."""
    paths, wanted = job_scopes(None if cfg.all_namespaces else cfg.namespaces)
    out: list[dict[str, Any]] = []
    for path in paths:
        items, _ = await list_pages(kube, path, {})
        out += [i for i in items if wanted is None or wanted((i.get("metadata") or {}).get("namespace", ""))]
    return out


async def relist(gate: Gate, kube: kube_mod.Kube, cfg: Settings) -> list[dict[str, Any]]:
    """On acquiring the Lease (handlers.Controller.start_leading): admit events, then list every GRPOJob in scope,
    less those deleted while the list was in flight; the items carry their kind (a list's items have none)."""
    gate.active, gate.relisting = True, True
    try:
        items = await list_jobs(kube, cfg)
    finally:
        gate.relisting = False
    kept = [as_job(item) for item in items if (item.get("metadata") or {}).get("uid") not in gate.deleted_meanwhile]
    gate.deleted_meanwhile.clear()
    log.info("leader: re-listed %d jobs; starting the controller", len(items))
    return kept


def lease_of(cfg: Settings) -> tuple[str, str]:
    ns, _, name = (cfg.leader_elect_lease or "").partition("/")
    return ns, name


Elected = tuple[leader.Elector, "asyncio.Task[None]", LoopThread]


async def start(cfg: Settings, start_leading: Callable[[], Coroutine[Any, Any, None]],
                login: Callable[..., Awaitable[Any]]) -> Elected:
    """The elector, on its own thread and loop with its own API session (its requests never wait
    behind the controller's writes), as the fence of every write. `login` is kopf's (registration._login);
    `start_leading` (the controller's: the re-list, then its loops) runs on the calling loop, beside the controller."""
    main = asyncio.get_running_loop()
    # The operator's loop also serves the webhook (whose load a tenant chooses: 200 costly reviews in flight delayed
    # the renewals there past the renew deadline, and the leader exited); here a renewal waits only for the GIL.
    thread = LoopThread("grpo-leader-election")

    async def on_leading() -> None:
        await run_on(start_leading(), main)

    async def create() -> tuple[leader.Elector, asyncio.Task[None]]:
        import kopf

        info = await login(logger=log, settings=kopf.OperatorSettings())
        session = kube_mod.Kube(info, relogin=lambda: login(logger=log, settings=kopf.OperatorSettings()),
                                timeout=cfg.leader_timing.renew_deadline / 2, limit=4)
        ns, name = lease_of(cfg)
        elector = leader.Elector(session, ns, name, timing=cfg.leader_timing, on_leading=on_leading)
        return elector, asyncio.get_running_loop().create_task(elector.run(), name="leader-election")

    elector, task = await thread.call(create())
    kube_mod.set_fence(elector.fence)  # called on the operator's loop: it reads two fields the elector writes
    return elector, task, thread


async def _stop(elector: leader.Elector, task: asyncio.Task[None]) -> None:
    for t in (task, elector.leading_task):
        if t is None:
            continue
        t.cancel()
        try:
            await t
        except asyncio.CancelledError:
            pass
    await elector.release()
    await elector.kube.close()


async def stop(elector: leader.Elector, task: asyncio.Task[None], thread: LoopThread) -> None:
    """After the controller stopped (graceful shutdown): stop renewing (and starting to lead), release the Lease, end
    the elector's thread."""
    try:
        await thread.call(_stop(elector, task))
    finally:
        thread.close()
