"""Live training progress: every `interval` seconds, GET /metrics of the running jobs' trainer pods (only the known
global-rank-0 pod once found), turn the text into status.progress (lifecycle.progress, pure) and kick the job's
reconciler, which carries it into its status write: for free when the status changes anyway, else at most once
per interval per job. Best effort: a failed scrape is counted and tried again next round."""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import aiohttp

from .. import lifecycle
from ..api.status import TERMINAL, Phase
from ..lifecycle import progress as progress_mod
from . import metrics as opmetrics

log = logging.getLogger("grpo_operator")

Key = tuple[str, str]  # (namespace, job name)
MAX_METRICS_BYTES = 1 << 20


@dataclass
class ProgressState:
    """In memory, per job: the latest scraped progress and when progress was last written (not kept in the cluster:
    after an operator restart the first change is written at once)."""

    latest: Optional[dict[str, Any]] = None
    last_write: Optional[float] = None  # monotonic
    rank0_pod: Optional[str] = None
    attempt: Optional[int] = None


class ProgressScraper:
    def __init__(self, interval: float, jobs: Mapping[Key, dict[str, Any]],
                 endpoints: Callable[[Key], list[progress_mod.Endpoint]],
                 kick: Callable[[Key], None], kick_later: Callable[[Key, float], None]):
        self.interval = interval  # 0: off
        self.jobs = jobs  # the controller's job cache (read only)
        self.endpoints = endpoints  # a job's trainer pods' metrics endpoints (from the pod watch)
        self.kick, self.kick_later = kick, kick_later
        self.states: dict[Key, ProgressState] = {}
        self._task: Optional[asyncio.Task[None]] = None
        self._http: Optional[aiohttp.ClientSession] = None

    def start(self) -> None:
        if self.interval > 0 and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._forever(), name="progress")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._http is not None:
            await self._http.close()

    def forget(self, key: Key) -> None:
        self.states.pop(key, None)

    # ------------------------------------------------------------------ writing
    def carry(self, key: Key, old: dict[str, Any], desired: dict[str, Any]) -> bool:
        """Put the latest scraped progress into `desired` when progress.decide_write allows; else, if only the rate
        limit held it back, come back when it allows."""
        state = self.states.get(key)
        if state is None or state.latest is None:
            return False
        if desired.get("progress") != old.get("progress") or desired.get("phase") in TERMINAL:
            return False  # a finished job keeps its final progress (from the trainer's result): no late scrape
        decision = progress_mod.decide_write(old.get("progress"), state.latest,
                                             writing_anyway=lifecycle.status_patch(old, desired) is not None,
                                             last_write=state.last_write, now=time.monotonic(), interval=self.interval)
        if decision.include:
            desired["progress"] = copy.deepcopy(state.latest)
            return True
        if decision.retry_after is not None:
            self.kick_later(key, decision.retry_after + 0.05)
        return False

    def written(self, key: Key) -> None:
        """A status write carrying progress went through: the rate limit counts from now."""
        self.states.setdefault(key, ProgressState()).last_write = time.monotonic()

    # ------------------------------------------------------------------ scraping
    async def _forever(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += self.interval
            await asyncio.sleep(max(due - loop.time(), 0.0))
            due = max(due, loop.time() - self.interval)  # after a long stall, do not burst to catch up
            try:
                await self.scrape_running_jobs()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("progress scrape round failed: %s: %s", type(exc).__name__, exc)

    async def scrape_running_jobs(self) -> None:
        keys = [k for k, b in list(self.jobs.items()) if (b.get("status") or {}).get("phase") == Phase.RUNNING]
        if keys:
            sem = asyncio.Semaphore(64)
            await asyncio.gather(*(self._scrape_job(k, sem) for k in keys))

    def _running_attempt(self, key: Key) -> Optional[int]:
        """The attempt the job runs now, from the cached job; None unless it is Running."""
        status = (self.jobs.get(key) or {}).get("status") or {}
        return lifecycle.as_int(status.get("restarts"), 0) if status.get("phase") == Phase.RUNNING else None

    async def _scrape_job(self, key: Key, sem: asyncio.Semaphore) -> None:
        attempt = self._running_attempt(key)
        if attempt is None:
            return
        state = self.states.setdefault(key, ProgressState())
        if state.attempt != attempt:
            state.attempt, state.rank0_pod = attempt, None
        targets = progress_mod.endpoints_to_scrape(self.endpoints(key), attempt, state.rank0_pod)
        if not targets:
            return
        async with sem:
            found = await asyncio.gather(*(self._fetch(e) for e in targets))
        if self._running_attempt(key) != attempt:
            return  # the attempt ended while we waited (a gang restart): this is no news about the job any more
        chosen = progress_mod.choose_rank0(s for s in found if s is not None)
        if chosen is None:
            if any(s is not None for s in found):
                opmetrics.PROGRESS_SCRAPES.labels(result="no_rank0").inc()
            state.rank0_pod = None  # look at every pod next round
            return
        state.rank0_pod = chosen.pod
        current = (self.jobs[key].get("status") or {}).get("progress")
        new = progress_mod.to_progress(chosen, previous=state.latest or current)
        if new is None:
            return
        state.latest = new
        if new != current:
            self.kick(key)

    async def _fetch(self, ep: progress_mod.Endpoint) -> Optional[progress_mod.Scrape]:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(trust_env=False, connector=aiohttp.TCPConnector(limit=64))
        timeout = aiohttp.ClientTimeout(total=min(5.0, max(1.0, self.interval / 3)))
        result = "ok"
        try:
            async with self._http.get(ep.url, timeout=timeout, allow_redirects=False) as resp:
                if resp.status != 200:
                    result = "http"
                    return None
                raw = await resp.content.read(MAX_METRICS_BYTES)
            try:
                return progress_mod.parse_metrics(raw.decode("utf-8", "replace"), ep.pod)
            except progress_mod.MetricsParseError:
                result = "parse"
                return None
        except TimeoutError:
            result = "timeout"
            return None
        except (aiohttp.ClientError, OSError):
            result = "connection"
            return None
        finally:
            opmetrics.PROGRESS_SCRAPES.labels(result=result).inc()
