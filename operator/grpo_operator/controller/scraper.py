"""Live training progress: every `interval` seconds, GET /metrics of the running jobs' trainer pods (only the known
global-rank-0 pod once found), turn the text into status.progress (lifecycle.progress, pure) and kick the job's
reconciler, which carries it into its status write: for free when the status changes anyway, else at most once
per interval per job. Best effort: a failed scrape is counted and tried again next round.

While a Pending job's spec.cache download pod runs, the same round GETs its /progress (its last `GRPO_STAGE` record,
grpo_trainer/stage.py) and kicks the job when the record changed: decide() reads it as JobView.stage_progress and
puts bytes and files done/total into the Staged condition's message (lifecycle/staging.py)."""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

import aiohttp

from .. import lifecycle
from ..api.status import TERMINAL, Phase
from ..lifecycle import progress as progress_mod
from ..lifecycle import staging
from . import metrics as opmetrics
from .stalls import StallTracker

log = logging.getLogger("grpo_operator")

Key = tuple[str, str]  # (namespace, job name)
MAX_METRICS_BYTES = 1 << 20
T = TypeVar("T")


@dataclass
class ProgressState:
    """In memory, per job: the latest scraped progress and when progress was last written (not kept in the cluster:
    after an operator restart the first change is written at once)."""

    latest: Optional[dict[str, Any]] = None
    last_write: Optional[float] = None  # monotonic
    rank0_pod: Optional[str] = None
    attempt: Optional[int] = None
    stage: Optional[dict[str, Any]] = None  # the download pod's last GRPO_STAGE record (spec.cache), while it runs


class ProgressScraper:
    def __init__(self, interval: float, jobs: Mapping[Key, dict[str, Any]],
                 endpoints: Callable[[Key], list[progress_mod.Endpoint]],
                 kick: Callable[[Key], None], kick_later: Callable[[Key, float], None],
                 stalls: Optional[StallTracker] = None):
        self.interval = interval  # 0: off
        self.jobs = jobs  # the controller's job cache (read only)
        self.endpoints = endpoints  # a job's trainer pods' metrics endpoints (from the pod watch)
        self.kick, self.kick_later = kick, kick_later
        self.stalls = stalls  # hung-job watch (controller/stalls.py): every trainer pod is scraped, not rank 0's only
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

    def stage_progress(self, key: Key) -> Optional[dict[str, Any]]:
        """The job's download pod's last progress record (JobView.stage_progress); None before the first scrape."""
        state = self.states.get(key)
        return state.stage if state is not None else None

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
        phases = {k: (b.get("status") or {}).get("phase") for k, b in list(self.jobs.items())}
        keys = [k for k, p in phases.items() if p == Phase.RUNNING]
        staging_keys = [k for k, p in phases.items() if p == Phase.PENDING]
        for k in keys:  # past staging: its record is no news any more
            if k in self.states:
                self.states[k].stage = None
        if keys or staging_keys:
            sem = asyncio.Semaphore(64)
            await asyncio.gather(*(self._scrape_job(k, sem) for k in keys),
                                 *(self._scrape_stage(k, sem) for k in staging_keys))

    async def _scrape_stage(self, key: Key, sem: asyncio.Semaphore) -> None:
        """A Pending job's running download pod: its last GRPO_STAGE record; a kick when it changed."""
        endpoint = progress_mod.stage_endpoint(self.endpoints(key))
        if endpoint is None:
            if key in self.states:
                self.states[key].stage = None
            return
        async with sem:
            record = await self._get(endpoint.url, staging.parse_record)
        state = self.states.setdefault(key, ProgressState())
        if record is not None and record != state.stage and key in self.jobs:
            state.stage = record
            self.kick(key)

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
        targets = progress_mod.endpoints_to_scrape(self.endpoints(key), attempt,
                                                   None if self.stalls is not None else state.rank0_pod)
        if not targets:
            return
        async with sem:
            found = await asyncio.gather(*(self._fetch(e) for e in targets))
        if self._running_attempt(key) != attempt:
            return  # the attempt ended while we waited (a gang restart): this is no news about the job any more
        chosen = progress_mod.choose_rank0(s for s in found if s is not None)
        if self.stalls is not None:
            self._watch_stall(key, attempt, targets, found, chosen)
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

    def _watch_stall(self, key: Key, attempt: int, targets: list[progress_mod.Endpoint],
                     found: list[Optional[progress_mod.Scrape]], chosen: Optional[progress_mod.Scrape]) -> None:
        assert self.stalls is not None
        step = chosen.values.get("step") if chosen is not None else None
        now = lifecycle.now_utc()
        self.stalls.observe(key, attempt, [(e.pod, f) for e, f in zip(targets, found, strict=True)],
                            int(step) if step is not None else None, now)
        if self.stalls.suspicious(key, now):
            self.kick(key)  # its deadlines are the lifecycle's to check (lifecycle/stall.py)

    async def _fetch(self, ep: progress_mod.Endpoint) -> Optional[progress_mod.Scrape]:
        return await self._get(ep.url, lambda text: progress_mod.parse_metrics(text, ep.pod))

    async def _get(self, url: str, parse: Callable[[str], T]) -> Optional[T]:
        """parse() of a 200 answer's body (at most MAX_METRICS_BYTES), else None; each GET counted by its result."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(trust_env=False, connector=aiohttp.TCPConnector(limit=64))
        timeout = aiohttp.ClientTimeout(total=min(5.0, max(1.0, self.interval / 3)))
        result = "ok"
        try:
            async with self._http.get(url, timeout=timeout, allow_redirects=False) as resp:
                if resp.status != 200:
                    result = "http"
                    return None
                raw = await resp.content.read(MAX_METRICS_BYTES)
            try:
                return parse(raw.decode("utf-8", "replace"))
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
