"""Posts the operator's Kubernetes Events in the background, off the reconcile path.

Like client-go's event broadcaster: a reconcile only *records* an Event (a bounded queue); a few writers post
them. Events are best effort and must never compete with the writes that make a job progress (pods, status):
with 1000 jobs created at once, posting them inline cost ~20 % of the time to converge. So a writer also holds
its Event back while every write slot is taken (`busy`: a burst), for at most MAX_DEFER_SECONDS after it was
recorded: in a burst of 1000 new jobs the API server's time goes to the pods and statuses first (an Event is a
write like them: a seventh of the burst's writes). When the queue is full the new Event is dropped and counted
(grpo_operator_events_dropped_total), as client-go does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from .. import api, lifecycle
from . import metrics as opmetrics

log = logging.getLogger("grpo_operator")

Post = Callable[[str, dict[str, Any]], Awaitable[Any]]

MAX_DEFER_SECONDS = 30.0  # the longest an Event waits for a burst of writes to end
DEFER_POLL_SECONDS = 0.1


def event_object(job: dict[str, Any], ev: lifecycle.JobEvent, now: str) -> dict[str, Any]:
    """The core/v1 Event for `ev` about the GRPOJob `job`, stamped `now`."""
    meta = job.get("metadata") or {}
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{uuid.uuid4().hex[:16]}", "namespace": meta.get("namespace")},
        "involvedObject": {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta.get("name"),
                           "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                           "resourceVersion": meta.get("resourceVersion")},
        "reason": ev.reason, "message": ev.message[:1024], "type": ev.type,
        "source": {"component": "grpo-operator"}, "reportingComponent": "grpo-operator",
        "reportingInstance": os.environ.get("HOSTNAME", "grpo-operator"),
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class EventRecorder:
    def __init__(self, post: Post, writers: int = 4, capacity: int = 4096, busy: Callable[[], bool] = lambda: False,
                 max_defer: float = MAX_DEFER_SECONDS):
        self._post = post
        self._writers = writers
        self._busy, self._max_defer = busy, max_defer
        self._closing = False
        # (namespace, Event, the loop's time it was recorded)
        self._queue: asyncio.Queue[tuple[str, dict[str, Any], float]] = asyncio.Queue(maxsize=capacity)
        self._tasks: list[asyncio.Task[None]] = []

    def record(self, job: dict[str, Any], ev: lifecycle.JobEvent) -> None:
        meta = job.get("metadata") or {}
        log.info("%s/%s: %s %s: %s", meta.get("namespace"), meta.get("name"), ev.type, ev.reason, ev.message)
        obj = event_object(job, ev, lifecycle.fmt_time(lifecycle.now_utc()))
        loop = asyncio.get_running_loop()
        try:
            self._queue.put_nowait((meta.get("namespace") or "default", obj, loop.time()))
        except asyncio.QueueFull:
            opmetrics.EVENTS_DROPPED.inc()
            return
        if not self._tasks:
            self._closing = False
            self._tasks = [loop.create_task(self._writer(), name=f"events {i}") for i in range(self._writers)]

    async def _writer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            ns, obj, recorded = await self._queue.get()
            try:
                while not self._closing and self._busy() and loop.time() - recorded < self._max_defer:
                    await asyncio.sleep(DEFER_POLL_SECONDS)
                await self._post(ns, obj)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("event %s for %s not posted: %s", obj.get("reason"), obj["involvedObject"].get("name"), exc)
            finally:
                self._queue.task_done()

    async def close(self, flush_seconds: Optional[float] = 2.0) -> None:
        """Post what is queued (bounded by `flush_seconds`, held back no longer), then stop the writers."""
        self._closing = True
        if self._tasks and flush_seconds:
            try:
                await asyncio.wait_for(self._queue.join(), flush_seconds)
            except TimeoutError:
                pass
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
