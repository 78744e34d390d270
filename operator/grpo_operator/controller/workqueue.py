"""The reconcile work queue: one coalescing asyncio task per job, a bound on passes in flight, retries with backoff,
timers and the periodic resync.

At most one pass of a job runs at a time; kicks arriving meanwhile fold into one more pass after it. A failed pass
is retried later, whole (level-triggered). A finished task is dropped at once: a job that is quiet costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Optional

from . import metrics as opmetrics

log = logging.getLogger("grpo_operator")

Key = tuple[str, str]  # (namespace, job name)


class WorkQueue:
    def __init__(self, work: Callable[[Key], Awaitable[None]], max_passes: int, resync_seconds: float,
                 keys: Callable[[], Iterable[Key]]):
        self.work = work  # one reconcile pass of a job
        self.keys = keys  # every known job, for the resync
        self.resync_seconds = resync_seconds
        self.tasks: dict[Key, asyncio.Task[None]] = {}  # the running (or waiting) task of each kicked job
        self.dirty: set[Key] = set()  # kicked while its task runs: one more pass
        self.errors: dict[Key, int] = {}  # consecutive failed passes, for the backoff
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        # Passes running at once. A pass holds the parsed spec and the rendered children while it waits for a write
        # slot: 1000 jobs arriving together would otherwise hold 1000 of those at once — a memory peak the process
        # keeps — for no speed, since only so many writes are in flight.
        self._passes = asyncio.Semaphore(max(max_passes, 1))
        self._resync: Optional[asyncio.Task[None]] = None
        self.failed_passes = 0

    def kick(self, key: Key) -> None:
        task = self.tasks.get(key)
        if task is not None and not task.done():
            self.dirty.add(key)
            return
        self.dirty.discard(key)
        self.tasks[key] = asyncio.get_running_loop().create_task(self._run(key), name=f"reconcile {key[0]}/{key[1]}")

    def kick_later(self, key: Key, delay: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        old = self._timers.get(key)
        if old is not None and old[0] <= due and not old[1].cancelled():
            return
        if old is not None:
            old[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._timer_fired, key))

    def kick_all(self) -> None:
        for key in list(self.keys()):
            self.kick(key)

    def forget(self, key: Key) -> None:
        self.errors.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()

    def start_resync(self) -> None:
        """Re-kick every job every resync_seconds: status converges even when a write or an event was lost."""
        if self._resync is None or self._resync.done():
            self._resync = asyncio.get_running_loop().create_task(self._resync_forever(), name="resync")

    def close(self) -> None:
        for task in [self._resync, *self.tasks.values()]:
            if task is not None:
                task.cancel()
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # ------------------------------------------------------------------ internals
    def _timer_fired(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.kick(key)

    async def _resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            self.kick_all()

    async def _run(self, key: Key) -> None:
        try:
            await self._run_passes(key)
        finally:
            if self.tasks.get(key) is asyncio.current_task():
                del self.tasks[key]  # a finished task holds its frame and result: not one per job forever

    async def _run_passes(self, key: Key) -> None:
        while True:
            async with self._passes:
                self.dirty.discard(key)  # kicks that came while this pass waited for its slot fold into it
                t0 = time.perf_counter()
                try:
                    await self.work(key)
                    self.errors.pop(key, None)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    n = self.errors[key] = self.errors.get(key, 0) + 1
                    self.failed_passes += 1
                    opmetrics.RECONCILE_ERRORS.inc()
                    delay = min(0.2 * 2 ** min(n, 8), 30.0) * (0.75 + random.random() / 2)
                    log.warning("reconcile %s/%s failed (%s: %s); retrying in %.1fs", key[0], key[1],
                                type(exc).__name__, exc, delay)
                    self.kick_later(key, delay)
                finally:
                    opmetrics.RECONCILE_DURATION.observe(time.perf_counter() - t0)
            if key not in self.dirty:
                return
