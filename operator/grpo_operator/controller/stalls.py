"""Hung jobs, the I/O side: what the scraper saw of each running attempt's trainers over time (StallTracker → the
lifecycle's StallWatch: when the step last moved, the job's recent step times, each rank's phase and when its heartbeat
last changed, endpoints that went silent) and the stack dumps lifecycle/stall.py asks for (POST /stacks on every
trainer pod of the attempt; the trainer's faulthandler writes them to the output volume and answers them).

Why an HTTP request on the metrics port: the operator has no pods/exec (nor should it), and py-spy would need
CAP_SYS_PTRACE, which PodSecurity "restricted" refuses. The port is already reachable from the operator only (the
per-job NetworkPolicy); the endpoint takes no input, answers POST only, runs one dump at a time, signals only the
pod's own training processes, and returns function names and file paths, no values."""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

import aiohttp

from grpo_trainer import contract

from ..lifecycle import progress as progress_mod
from ..lifecycle.stall_watch import RankBeat, RankStack, StackDump, StackRequest, StallPolicy, StallWatch
from .workqueue import Key

log = logging.getLogger("grpo_operator")
HISTORY = 20  # recent step times kept per job (the derived deadline's "slowest recent step")
QUIET = 60.0  # a step unchanged this long (or half the floor, if less) makes the scraper kick the job's reconcile


@dataclass
class _Rank:
    pod: str
    sample: progress_mod.RankSample
    beat_moved: _dt.datetime
    download_bytes: Optional[float] = None
    download_moved: Optional[_dt.datetime] = None


@dataclass
class _Job:
    attempt: int
    since: _dt.datetime
    in_place: int = 0  # the attempt's in-place restarts when this record began (a restart in place starts anew)
    step: Optional[int] = None
    step_at: Optional[_dt.datetime] = None
    moved: bool = False  # the step advanced in this attempt
    history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    ranks: dict[int, _Rank] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    silent: dict[str, _dt.datetime] = field(default_factory=dict)
    stacks: Optional[StackDump] = None
    paused_seen: Optional[_dt.datetime] = None  # the last round that saw a rank saving or evaluating


def _download(old: Optional[_Rank], sample: progress_mod.RankSample,
              now: _dt.datetime) -> tuple[Optional[float], Optional[_dt.datetime]]:
    """The rank's largest download size seen and when it last grew: a first sighting proves nothing, a larger value
    than the last known one does (a scrape without the value keeps both)."""
    last = old.download_bytes if old is not None else None
    moved = old.download_moved if old is not None else None
    got = sample.download_bytes
    if got is None:
        return last, moved
    return max(got, last or 0.0), now if last is not None and got > last else moved


def _step_of(results: list[tuple[str, Optional[progress_mod.Scrape]]], logged: Optional[int]) -> Optional[int]:
    """The attempt's step: the furthest rank's (each rank publishes it at every step), else the logged step (an
    image without per-rank records). The logged step moves only every loggingSteps (10 by default in TRL): ten
    40-s steps between two moves would pass a 10 × 40 s deadline about as often as not."""
    ranks = [r.step for _, s in results if s is not None for r in s.ranks
             if r.step is not None and r.phase != contract.PHASE_LOADING]  # loading: not counted (the load is no step)
    return max([*ranks, *([logged] if logged is not None else [])], default=None)


def _trained(results: list[tuple[str, Optional[progress_mod.Scrape]]]) -> bool:
    """A rank past the step it began training at: the attempt has trained, even when its first steps all fell
    between two scrapes (a fast job: the tracker never saw the step move, yet the start-up allowance is over)."""
    return any(r.step is not None and r.began_step is not None and r.step > r.began_step
               and r.phase != contract.PHASE_LOADING for _, s in results if s is not None for r in s.ranks)


def _in_place_restarts(results: list[tuple[str, Optional[progress_mod.Scrape]]]) -> Optional[int]:
    """The in-place restarts global rank 0 reports for its attempt (None: no pod said)."""
    seen = [s.values["inPlaceRestarts"] for _, s in results if s is not None and "inPlaceRestarts" in s.values]
    return int(max(seen)) if seen else None


class StallTracker:
    def __init__(self, policy: StallPolicy = StallPolicy()):
        self.policy = policy
        self.jobs: dict[Key, _Job] = {}

    def forget(self, key: Key) -> None:
        self.jobs.pop(key, None)

    def observe(self, key: Key, attempt: int, results: Iterable[tuple[str, Optional[progress_mod.Scrape]]],
                step: Optional[int], now: _dt.datetime) -> None:
        """One scrape round of a running attempt: (pod, its scrape or None when it did not answer), the job's step."""
        job = self.jobs.get(key)
        results = list(results)
        in_place = _in_place_restarts(results)
        # A new attempt, or the gang restarted in place (new workers reload and resume from a checkpoint, their
        # steps start below the last one seen): its start-up allowance and its steps count from now.
        if job is None or job.attempt != attempt or (in_place is not None and in_place > job.in_place):
            history = job.history if job is not None else deque(maxlen=HISTORY)
            base = in_place if in_place is not None else 0
            job = self.jobs[key] = _Job(attempt, now, in_place=base, history=history)
        self._step(job, _step_of(results, step), now)
        if not job.moved and job.step is not None and _trained(results):
            job.moved = True  # its deadline counts from when this step was first seen (step_at)
        for pod, scrape in results:
            if scrape is None:
                if pod in job.answered:
                    job.silent.setdefault(pod, now)
                continue
            job.answered.add(pod)
            job.silent.pop(pod, None)
            listed = {x.rank for x in scrape.ranks}
            for gone in [r for r, x in job.ranks.items() if x.pod == pod and r not in listed]:
                del job.ranks[gone]  # its process exited (a finished rank): no heartbeat to expect
            for sample in scrape.ranks:
                if sample.phase in (contract.PHASE_SAVING, contract.PHASE_EVALUATING):
                    job.paused_seen = now
                old = job.ranks.get(sample.rank)
                moved = old is None or old.sample.heartbeat != sample.heartbeat
                job.ranks[sample.rank] = _Rank(pod, sample, now if moved or old is None else old.beat_moved,
                                               *_download(old, sample, now))

    @staticmethod
    def _step(job: _Job, step: Optional[int], now: _dt.datetime) -> None:
        if step is None or (job.step is not None and step <= job.step):  # steps of one attempt only go up
            return
        if job.step is not None and job.step_at is not None and step > job.step:
            job.history.append((now - job.step_at).total_seconds() / (step - job.step))
            job.moved = True
        job.step, job.step_at = step, now

    def watch(self, key: Key) -> Optional[StallWatch]:
        job = self.jobs.get(key)
        if job is None:
            return None
        ranks = tuple(RankBeat(r, x.pod, x.sample.phase, x.sample.since, x.beat_moved, x.sample.step, x.download_moved)
                      for r, x in sorted(job.ranks.items()))
        return StallWatch(job.attempt, job.since, job.step, job.step_at if job.moved else None, tuple(job.history),
                          ranks, tuple(sorted(job.silent.items())), job.stacks, job.paused_seen)

    def suspicious(self, key: Key, now: _dt.datetime) -> bool:
        """Worth a reconcile pass now (its deadlines are checked there): the step quiet for a minute, a heartbeat
        or an endpoint quiet for half its limit. A job whose steps move costs no extra pass."""
        job = self.jobs.get(key)
        if job is None:
            return False
        quiet = (now - (job.step_at if job.moved and job.step_at else job.since)).total_seconds()
        return quiet >= min(QUIET, self.policy.floor / 2) or bool(job.silent) \
            or any((now - r.beat_moved).total_seconds() >= self.policy.heartbeat / 2 for r in job.ranks.values())

    def stacks_done(self, key: Key, dump: StackDump) -> None:
        job = self.jobs.get(key)
        if job is not None and job.attempt == dump.attempt:
            job.stacks = dump


async def post_stacks(url: str, timeout: float) -> Optional[dict[str, Any]]:
    """The pod's answer to POST /stacks ({"ranks": {...}}), or None."""
    try:
        async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            async with http.post(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
                return body if isinstance(body, dict) else None
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None


def to_dump(attempt: int, answers: list[tuple[str, Optional[dict[str, Any]]]]) -> StackDump:
    ranks, silent = [], []
    for pod, answer in answers:
        if answer is None:
            silent.append(pod)
            continue
        for rank, rec in (answer.get("ranks") or {}).items():
            if str(rank).isdigit() and isinstance(rec, dict):
                ranks.append(RankStack(int(rank), bool(rec.get("dumped")), rec.get("phase"), str(rec.get("stack") or "")))
    return StackDump(attempt, tuple(sorted(ranks, key=lambda r: r.rank)), tuple(silent))


class StackDumps:
    """One dump per job and attempt at a time; its result goes to the tracker and the job is kicked."""

    def __init__(self, tracker: StallTracker, kick: Callable[[Key], None], timeout: float = 15.0):
        self.tracker, self.kick, self.timeout = tracker, kick, timeout
        self._tasks: dict[Key, tuple[int, asyncio.Task[None]]] = {}

    def request(self, key: Key, req: Optional[StackRequest], endpoints: list[progress_mod.Endpoint]) -> None:
        if req is None:
            return
        running = self._tasks.get(key)
        if running is not None and running[0] == req.attempt:
            return
        targets = [e for e in endpoints if e.attempt == req.attempt and e.role == contract.ROLE_TRAINER and e.ip
                   and e.port and e.running]
        self._tasks[key] = (req.attempt, asyncio.get_running_loop().create_task(self._run(key, req.attempt, targets)))

    async def _run(self, key: Key, attempt: int, targets: list[progress_mod.Endpoint]) -> None:
        urls = [e.url.rsplit("/", 1)[0] + contract.STACKS_PATH for e in targets]
        answers = await asyncio.gather(*(post_stacks(u, self.timeout) for u in urls))
        dump = to_dump(attempt, list(zip((e.pod for e in targets), answers, strict=True)))
        log.warning("%s/%s: stalled attempt %d: stacks of ranks %s dumped%s", key[0], key[1], attempt,
                    [r.rank for r in dump.ranks if r.dumped], f", no answer from {list(dump.unanswered)}"
                    if dump.unanswered else "")
        self.tracker.stacks_done(key, dump)
        self.kick(key)

    def forget(self, key: Key) -> None:
        entry = self._tasks.pop(key, None)
        if entry is not None:
            entry[1].cancel()
