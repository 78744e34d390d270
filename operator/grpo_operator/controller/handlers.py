"""The reconciler (Controller): I/O only. Every decision is lifecycle.decide(); kopf's side is registration.py.

The Controller is a composition of three parts, each with one interface:
  * the work queue (workqueue.py): one coalescing asyncio task per job, at most one pass of a job at a time, kicks
    arriving meanwhile fold into one more pass. Timers (backoff, deadline, TTL) and a periodic resync of every job
    re-kick it, so status converges even when a write or an event was lost.
  * the observers (observers.py): the job cache, the pod index with the expectations, the validation cache, the
    progress scraper, the engine probes and the stall tracker: what a pass decides from.
  * the writer (writer.py): the API client, the status write, deletes, creates and their refusals, Events, the
    NetworkPolicy, the HA gate: what a pass does.

A pass (reconcile): observe → lifecycle.decide() → the writer applies the decision (status first when it deletes
anything; a job's first creates before the status that records its start; writer.py says why).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import lifecycle
from . import ha
from . import metrics as opmetrics
from .jobwatch import JobWatch
from .observers import Observers
from .settings import Settings
from .workqueue import Key, WorkQueue
from .writer import Writer

log = logging.getLogger("grpo_operator")


class Controller:
    """Per-operator state: the work queue, the observers (what is read) and the writer (what is written)."""

    def __init__(self, config: Settings):
        self.config = config
        self.queue = WorkQueue(lambda key: self.reconcile(key), 2 * max(config.max_concurrent_writes, 1),
                               config.resync_seconds, lambda: self.observers.jobs)
        self.observers = Observers(config, lambda: self.writer.kube, self.kick, self.kick_later, self.kick_all)
        self.writer = Writer(config, self.observers, self.kick, self.kick_later, self.forget)
        self.job_watch = JobWatch(lambda: self.writer.kube, None if config.all_namespaces else config.namespaces,
                                  self.job_event)
        self._releases: set[asyncio.Task[None]] = set()  # deleted jobs' pods being released

    def __copy__(self) -> Controller:
        # kopf shallow-copies the operator's memo for every object it watches (with --peering: the jobs); the
        # controller is shared state by design, so every object gets the one instance.
        return self

    # ------------------------------------------------------------------ jobs
    def job_event(self, kind: str, raw: dict[str, Any]) -> None:
        """A GRPOJob watch event (jobwatch.py; kopf's with --peering): cache the job and kick its reconciler, or forget
        a deleted one and release its pods. A standby drops it (ha.admit_event). `raw` is never modified afterwards
        (by the watch or by us): it is kept as it is, not deep-copied."""
        if not ha.admit_event(self.writer.gate, {"type": kind}, raw):
            return
        self.ensure_background()
        meta = raw.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if kind == "DELETED":
            self.forget(key)  # first: a reconcile queued meanwhile must not act on the deleted job's old body
            task = asyncio.get_running_loop().create_task(self.release_deleted_job(key, raw), name=f"release {key}")
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
            return
        self.observers.observe_job(raw)
        self.kick_changed(key)  # no pass for a version a pass already started from (our own write's)

    # ------------------------------------------------------------------ scheduling
    def kick(self, key: Key) -> None:
        self.queue.kick(key)

    def kick_changed(self, key: Key) -> None:
        """A job's watch event: a pass, unless one already started from the version cached now. Our own status write's
        event is such a version (its response was cached, and the pods' events usually kick a pass before the event
        arrives): a pass on it would decide from what a pass already decided from. Everything else that feeds a
        decision (pods, timers, probes, the resync) kicks on its own."""
        if self.observers.changed(key):
            self.kick(key)

    def kick_later(self, key: Key, delay: float) -> None:
        self.queue.kick_later(key, delay)

    def kick_all(self) -> None:
        self.queue.kick_all()

    def forget(self, key: Key) -> None:
        self.queue.forget(key)
        self.observers.forget(key)
        self.writer.forget(key)
        opmetrics.forget_job(*key)

    def ensure_background(self) -> None:
        self.queue.start_resync()
        self.observers.start()

    async def close(self) -> None:
        """Stop everything this controller started and close its connections (kopf's cleanup calls it)."""
        self.queue.close()
        await self.job_watch.close()
        for task in list(self._releases):
            task.cancel()
        await self.observers.close()
        await self.writer.close()

    async def start_leading(self) -> None:
        """Called on acquiring the Lease (again after a failure: leader.Elector retries it): admit events, re-list the
        jobs (ha.relist), then start the controller's loops. A failed re-list raises: the jobs that existed before the
        takeover would otherwise never be cached, and so never reconciled."""
        while self.writer.kube is None:  # kopf's login handler creates it, at start-up
            await asyncio.sleep(0.1)
        for item in await ha.relist(self.writer.gate, self.writer.kube, self.config):
            self.observers.observe_job(item)  # keeps a newer version already cached from an event meanwhile
        self.ensure_background()
        self.kick_all()

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, key: Key) -> None:
        """One pass for one job, counted once done (grpo_operator_reconcile_passes_total)."""
        body = self.observers.jobs.get(key)
        if body is None or self.writer.kube is None or not self.observers.synced:
            return  # every job is kicked once the pods are listed
        self.writer.stats["reconciles"] += 1
        await self._pass(key, body)
        if key in self.observers.jobs:  # not a job forgotten during the pass (deleted): its series is gone
            opmetrics.RECONCILE_PASSES.labels(namespace=key[0], name=key[1]).inc()

    async def _pass(self, key: Key, body: dict[str, Any]) -> None:
        """Observe, decide, then the writer writes the status, sends the deletes, creates (writer.apply's order)."""
        seen = self.observers.observe(key, body, self.writer.refusals.get(key))
        dec = lifecycle.decide(seen.view, seen.pods, lifecycle.now_utc(), self.config.policy)
        self.observers.follow_up(key, dec)  # reads: an engine probe, a stalled attempt's stacks
        await self.writer.apply(key, seen, dec)

    async def release_deleted_job(self, key: Key, body: dict[str, Any]) -> None:
        """A job deleted at once: its pods' gang groups released and the pods deleted (writer.release_deleted_job)."""
        if self.observers.pods is None:
            return
        await self.writer.release_deleted_job(key, body, self.observers.pods_of(key))
