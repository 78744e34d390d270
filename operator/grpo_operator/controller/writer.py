"""Every write of the reconciler (Writer): a pass's decision carried out (apply), in the order that keeps a lost write
harmless. The reads are observers.py's; handlers.py composes both around lifecycle.decide().

What it owns: the API client handle (kube.py; kopf's login handler replaces it) and the write slots (a semaphore:
API writes in flight), the status write (a merge patch of what differs, conditional on the resourceVersion it was
decided from: a 409 reads the current version and decides again), pod deletes, force deletes and the gang groups'
releases (each at most once per window: ratelimit.py), the create path (creates.py) and its refusals (refused.py),
the Events (a background recorder: events.py), a running job's NetworkPolicy (netpols.py), the HA gate (ha.py: a
standby acts on nothing; the fence itself sits in kube.py, before every write) and the counters (stats).

The order of a pass's writes (apply): the status first when the decision deletes anything (a gang restart never
runs on an unrecorded decision); creations carry their attempt in the pods themselves, so they go alongside the
status write, except a job's first ones, which go before the status that records its start (startTime, Created): a
refused create ends the pass there, and the retry, knowing the refusal, writes CreateFailed instead of the claim.
Then Events, deletions, the NetworkPolicy, the remaining creations and the requeue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Optional

from .. import lifecycle
from ..api.status import Phase, Reason
from ..lifecycle import progress as progress_mod
from . import events, ha, kube
from . import metrics as opmetrics
from .creates import Creator
from .netpols import PolicyKeeper
from .observers import Observed, Observers
from .ratelimit import RateLimiter
from .refused import Refusals
from .settings import Settings
from .workqueue import Key

log = logging.getLogger("grpo_operator")

# How long before the same request is sent again: decide() repeats it on every pass until the watch shows its effect,
# which is on the way.
DELETE_RESEND_SECONDS = 5.0  # a pod delete
FORCE_DELETE_RESEND_SECONDS = 30.0  # a grace-0 delete of a pod stuck terminating (one ForceDeleted Event per send)
RELEASE_RESEND_SECONDS = 5.0  # the patch that has a gang scheduler release a pod's group (lifecycle/gangs Release)
# When to look at a job again (the create path's retries: creates.py):
REQUEUE_SLACK_SECONDS = 0.05  # after decide()'s requeue_after, so that the timer it waits for has passed


def _starts(old: dict[str, Any], new: Optional[dict[str, Any]]) -> bool:
    """Whether a decided status records the job's start for the first time."""
    return bool(new and new.get("startTime") and not old.get("startTime"))


def _count_restart(old: dict[str, Any], new: dict[str, Any]) -> None:
    """grpo_restarts_total{reason}: once per restart, when the status write that records it goes out."""
    new_restarts = int(new.get("restarts") or 0)
    if new.get("phase") == Phase.RESTARTING and new_restarts > int(old.get("restarts") or 0):
        opmetrics.RESTARTS.labels(reason=str(new.get("lastFailureReason") or "Unknown")).inc()


class Writer:
    """The operator's writes. `observers` gets back what a write returns (the job's new version, the progress
    written); `kick`, `kick_later` are the work queue's; `forget` (the controller's) drops a job found gone."""

    def __init__(self, config: Settings, observers: Observers, kick: Callable[[Key], None],
                 kick_later: Callable[[Key, float], None], forget: Callable[[Key], None]):
        self.config, self.observers = config, observers
        self._kick, self._kick_later, self._forget = kick, kick_later, forget
        self.kube: Optional[kube.Kube] = None
        self._sem = asyncio.Semaphore(config.max_concurrent_writes)  # API writes in flight
        self.stats = {"reconciles": 0, "status_writes": 0, "creates": 0, "deletes": 0}
        self.gate = ha.Gate(config.leader_elect)  # --leader-elect: a standby acts on nothing (ha.py)
        # Events wait while every write slot is taken (a burst): pods and statuses first (events.py)
        self.events = events.EventRecorder(self._send_event, busy=self._sem.locked)
        self.refusals = Refusals(self.events)  # refused creates: FailedCreate Events, the CreateFailed record
        self.deletes = RateLimiter(DELETE_RESEND_SECONDS)
        self.force_deletes = RateLimiter(FORCE_DELETE_RESEND_SECONDS)
        self.group_ends = RateLimiter(RELEASE_RESEND_SECONDS)
        # the create path: render, refusals, 409s (creates.py)
        self.creates = Creator(config, lambda: self.kube, self._sem, self.stats, observers.expectations, self.events,
                               self.refusals, kick_later)
        self.netpols = PolicyKeeper(config, lambda: self.kube, self._sem)  # a running job's policy kept as rendered

    def forget(self, key: Key) -> None:
        self.refusals.forget(key)
        self.netpols.forget(key)

    async def close(self) -> None:
        await self.events.close()
        if self.kube is not None:
            await self.kube.close()

    # ------------------------------------------------------------------ a pass
    async def apply(self, key: Key, seen: Observed, dec: lifecycle.Decision) -> None:
        """Carry out a pass's decision: status, deletes, creates in the order the module's docstring gives."""
        body, res = seen.body, seen.res
        k = self.kube
        assert k is not None  # reconcile() checked
        creating = bool(dec.create_pods and dec.create_attempt is not None)
        create_first = creating and not (dec.delete_pods or dec.delete_job)
        if create_first and _starts(seen.view.status, dec.status):
            await self.creates.create_decided(key, body, res, dec)
            if key in self.refusals:  # refused without an error raised (a ConfigMap over the size limit)
                self._kick(key)
                return
            create_first = creating = False
        create_task = asyncio.get_running_loop().create_task(self.creates.create_decided(key, body, res, dec)) \
            if create_first else None
        try:
            job_exists = await self._write_status(key, seen, dec)
        finally:
            if create_task is not None:
                await create_task
        if not job_exists:
            return
        for ev in dec.events:  # best effort, sent in the background
            self.events.record(body, ev)
        if dec.delete_job:
            await k.delete("GRPOJob", key[0], key[1], propagation="Background", uid=seen.uid)
            return
        await self._send_deletes(key, body, dec, seen.pods)
        if seen.pods:  # a job with pods: its NetworkPolicy as render produces it now (netpols.py)
            await self.netpols.keep(key, seen.uid, res)
        if creating and not create_first:
            await self.creates.create_decided(key, body, res, dec)
        if dec.requeue_after is not None:
            self._kick_later(key, dec.requeue_after + REQUEUE_SLACK_SECONDS)

    # ------------------------------------------------------------------ status
    async def _write_status(self, key: Key, seen: Observed, dec: lifecycle.Decision) -> bool:
        """The decided status as a merge patch of what differs (no write when nothing does), conditional on the
        resourceVersion it was decided from; False: nothing more to do in this pass (the job is gone, or it changed
        meanwhile and is decided again from its current version)."""
        if dec.status is None:
            return True
        assert self.kube is not None
        old = lifecycle.clean_status(seen.view.status)
        progress = self.observers.progress
        carried = progress.carry(key, old, dec.status)
        patch = progress_mod.fix_progress_patch(lifecycle.status_patch(old, dec.status), old)
        if not patch:
            return True
        rv = (seen.body.get("metadata") or {}).get("resourceVersion")
        try:
            async with self._sem:
                resp = await self.kube.patch_status("GRPOJob", key[0], key[1], patch, resource_version=rv)
        except kube.NotFound:
            self._forget(key)
            return False
        except kube.Conflict:
            await self._refresh(key, seen.uid)
            return False
        self.stats["status_writes"] += 1
        carried = carried and "progress" in patch
        opmetrics.STATUS_WRITES.labels(progress="true" if carried else "false").inc()
        if carried:
            progress.written(key)
        _count_restart(old, dec.status)
        if isinstance(resp, dict) and (resp.get("metadata") or {}).get("uid") == seen.uid:
            self.observers.observe_job(resp)
        return True

    async def _refresh(self, key: Key, uid: str) -> None:
        """After a 409 on a status write (a user's edit, another replica's write): the current version into the cache
        and another pass, instead of acting on a decision made from an older one."""
        assert self.kube is not None
        try:
            async with self._sem:
                current = await self.kube.get("GRPOJob", key[0], key[1])
        except kube.NotFound:
            self._forget(key)
            return
        if (current.get("metadata") or {}).get("uid") == uid:
            self.observers.observe_job(current)
            self._kick(key)

    # ------------------------------------------------------------------ pods
    async def _send_deletes(self, key: Key, body: dict[str, Any], dec: lifecycle.Decision,
                            pods: list[lifecycle.PodInfo]) -> None:
        """Pod deletes (with uid preconditions), force deletes, releases of gang groups: each at most once per its window,
        in parallel."""
        ns = key[0]
        uids = {p.name: p.uid for p in pods}
        now = time.monotonic()
        sends = []
        for pod in dec.delete_pods:
            if self.deletes.allow((ns, pod), now):
                sends.append(self._delete_pod(ns, pod, uids.get(pod)))
        for pod, why in dec.force_delete_pods:  # decide() repeats these until the pod is gone: one event per send
            if self.force_deletes.allow((ns, pod), now):
                self.events.record(body, lifecycle.JobEvent("Warning", Reason.FORCE_DELETED, why))
                sends.append(self._delete_pod(ns, pod, uids.get(pod), grace_seconds=0))
        for pod in dec.release_pods:  # decide() repeats these until the pods show the mark
            if self.group_ends.allow((ns, pod), now):
                sends.append(self._release_group(ns, pod, dec.release))
        if sends:
            await asyncio.gather(*sends)

    async def _delete_pod(self, ns: str, name: str, uid: Optional[str], grace_seconds: Optional[int] = None) -> None:
        assert self.kube is not None
        try:
            async with self._sem:
                await self.kube.delete("Pod", ns, name, uid=uid, grace_seconds=grace_seconds)
            self.stats["deletes"] += 1
        except kube.Conflict:  # uid precondition failed: a newer pod of that name; leave it
            pass

    async def release_deleted_job(self, key: Key, body: dict[str, Any], pods: list[lifecycle.PodInfo]) -> None:
        """A job deleted at once (no finalizer of ours to wait on): its pods (`pods`, the index's) are still listed.
        Release their gang groups (so that the scheduler frees the quota instead of waiting for replacement pods),
        then delete them ourselves rather than wait for the garbage collector (best effort: the collector remains the
        backstop)."""
        if self.kube is None:
            return
        view = lifecycle.JobView.from_body(body)
        dec = lifecycle.decision.deleted_job(view, pods)
        for pod in dec.release_pods:
            await self._release_group(key[0], pod, dec.release)
        uids = {p.name: p.uid for p in pods}
        names = [n for n in dec.delete_pods if self.deletes.allow((key[0], n))]
        if names:
            log.info("%s/%s deleted: deleting its pods %s", key[0], key[1], ", ".join(names))
        await asyncio.gather(*(self._delete_pod(key[0], n, uids.get(n)) for n in names), return_exceptions=True)

    async def _release_group(self, ns: str, pod: str, release: Optional[lifecycle.gangs.Release]) -> None:
        """The job's gang scheduler's mark on one pod, which ends its group (lifecycle/gangs: e.g. the scheduler
        finishes the group once none of its pods runs, releases the quota and removes its finalizers)."""
        assert self.kube is not None
        if release is None:
            return
        try:
            async with self._sem:
                await self.kube.patch("Pod", ns, pod, dict(release.patch))
        except kube.NotFound:
            pass
        except kube.ApiError as exc:
            log.warning(release.refused.format(pod=f"{ns}/{pod}", error=exc))

    async def _send_event(self, namespace: str, event: dict[str, Any]) -> None:
        if self.kube is not None:
            await self.kube.post_event(namespace, event)
