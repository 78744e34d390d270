"""Stall detection over long synthetic runs: false positives on healthy jobs, misses and time to Stalled on hung ones.

    .venv/bin/python -m bench.stall_bench [--seeds 20] [--hours 12]

Each trace is a 2-node job (one training process per pod) played phase by phase — download and load, generation,
rewards, the optimizer step, checkpoint saves, evaluations — with jittered durations drawn from the scenario. Every
15 s (the default --progress-interval) the bench builds what the scraper would parse from each pod's /metrics
(each rank's phase, entry time, heartbeat, step and, while loading, its Hub cache's bytes; the logged step, which
moves every loggingSteps; a pod may miss a scrape) and feeds it to the operator's own StallTracker
(controller/stalls.py) and find_stall (lifecycle/stall.py, what detect_stall decides with) at the default
thresholds. Healthy scenarios must never stall; hung ones must, and the bench reports how long after the hang.

Side by side in the same run, on the same traces: `now` (this code) and `before` — the rules as they were before
this bench found their false positives, reproduced on the same code: what the trainer published then (no per-rank
step, so the tracker follows the logged step; no download bytes), no evaluation allowance, the step deadline counted
from the step before a save (not from the save's end), and heartbeats judged frozen while their pod missed scrapes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Optional

from grpo_operator.controller.stalls import StallTracker
from grpo_operator.lifecycle import progress as progress_mod
from grpo_operator.lifecycle.stall import Stall, find_stall, silent_or_frozen
from grpo_operator.lifecycle.stall_watch import StallPolicy, StallWatch
from grpo_trainer import contract as C

SCRAPE = 15.0  # --progress-interval (the chart's default)
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DDP = 1800.0  # training.ddpTimeout unset: transformers' default


@dataclass
class Seg:
    phase: str
    start: float
    end: float
    step_after: bool = False  # the optimizer step completes at the segment's end
    bytes_from: float = 0.0  # a download: bytes at `start`, growing at `rate`
    rate: float = 0.0


@dataclass
class Trace:
    segs: list[Seg]
    logging_steps: int
    hang_at: Optional[float] = None  # the time the job hangs (None: healthy)
    stopped_rank: Optional[int] = None  # that rank's process is stopped (its pod stops answering)
    miss: float = 0.0  # probability a pod misses a scrape
    burst: float = 0.3  # probability a miss continues into the next scrape


@dataclass
class Scenario:
    name: str
    healthy: bool
    build: Callable[[random.Random, float], Trace]
    note: str = ""


# ---------------------------------------------------------------------------------------------- trace builders
def lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def startup(rng: random.Random, download_gb: float = 0.0, load: float = 120.0) -> list[Seg]:
    """A Hub download in chunks (a slow mirror pauses up to 90 s), then the model load and vLLM start."""
    segs, t, got = [], 0.0, 0.0
    total = download_gb * 1e9
    while got < total:
        rate = rng.uniform(20e6, 60e6)
        span = min(rng.uniform(30, 300), (total - got) / rate)
        segs.append(Seg(C.PHASE_LOADING, t, t + span, bytes_from=got, rate=rate))
        got, t = got + rate * span, t + span
        if rng.random() < 0.3:
            pause = rng.uniform(5, 90)
            segs.append(Seg(C.PHASE_LOADING, t, t + pause, bytes_from=got))
            t += pause
    segs.append(Seg(C.PHASE_LOADING, t, t + lognormal(rng, load, 0.3), bytes_from=got))
    return segs


def steps(rng: random.Random, segs: list[Seg], hours: float, step: Callable[[int], float], *,
          rewards: Callable[[int], float] = lambda i: 0.0, save_every: int = 0, save: Callable[[], float] = lambda: 0,
          eval_every: int = 0, evaluate: Callable[[], float] = lambda: 0) -> list[Seg]:
    """Training steps after the start-up: generation (60 %), rewards, the optimizer step (40 %); saves and evals."""
    t, i = segs[-1].end, 0
    while t < hours * 3600:
        i += 1
        s = step(i)
        for phase, span, done in ((C.PHASE_GENERATING, 0.6 * s, False), (C.PHASE_REWARDS, rewards(i), False),
                                  (C.PHASE_TRAINING, 0.4 * s, True)):
            segs.append(Seg(phase, t, t + span, step_after=done))
            t += span
        if save_every and i % save_every == 0:
            segs.append(Seg(C.PHASE_SAVING, t, t + save()))
            t = segs[-1].end
        if eval_every and i % eval_every == 0:
            segs.append(Seg(C.PHASE_EVALUATING, t, t + evaluate()))
            t = segs[-1].end
    return segs


def hang(trace: Trace, rng: random.Random, phase: str, after: float, stopped: Optional[int] = None) -> Trace:
    """The first `phase` segment after `after` seconds never ends."""
    for k, s in enumerate(trace.segs):
        if s.phase == phase and s.start >= after:
            cut = s.start + (s.end - s.start) * rng.uniform(0.1, 0.9)
            frozen = replace(s, end=math.inf, rate=s.rate if phase != C.PHASE_LOADING else 0.0)
            if phase == C.PHASE_LOADING:  # the bytes stop at `cut`; the phase goes on
                trace.segs = trace.segs[:k] + [replace(s, end=cut), replace(frozen, start=cut,
                                                                          bytes_from=s.bytes_from + s.rate * (cut - s.start))]
            else:
                trace.segs = trace.segs[:k] + [frozen]
            trace.hang_at, trace.stopped_rank = cut, stopped
            return trace
    raise ValueError(f"no {phase} segment after {after}s")


# ---------------------------------------------------------------------------------------------- scenarios
def _fast(rng: random.Random, h: float) -> Trace:
    return Trace(steps(rng, startup(rng), h, lambda i: lognormal(rng, 20, 0.25), save_every=200,
                       save=lambda: rng.uniform(60, 180)), 10)


def _slow(rng: random.Random, h: float) -> Trace:
    return Trace(steps(rng, startup(rng), h, lambda i: lognormal(rng, 45, 0.35), save_every=100,
                       save=lambda: rng.uniform(60, 300)), 10)


def _rewards(rng: random.Random, h: float) -> Trace:
    return Trace(steps(rng, startup(rng), h, lambda i: lognormal(rng, 30, 0.2),
                       rewards=lambda i: rng.uniform(200, 400)), 1)


def _evals(rng: random.Random, h: float) -> Trace:
    return Trace(steps(rng, startup(rng), h, lambda i: lognormal(rng, 30, 0.25), eval_every=100,
                       evaluate=lambda: rng.uniform(600, 1500)), 5)


def _saves(rng: random.Random, h: float) -> Trace:
    return Trace(steps(rng, startup(rng), h, lambda i: lognormal(rng, 60, 0.2), save_every=50,
                       save=lambda: rng.uniform(300, 1500)), 1)


def _download(rng: random.Random, h: float) -> Trace:
    return Trace(steps(rng, startup(rng, download_gb=100, load=600), h, lambda i: lognormal(rng, 30, 0.25)), 10)


def _growing(rng: random.Random, h: float) -> Trace:
    n = h * 3600 / 45  # about the steps of the run: the step time grows 15 s → 75 s
    return Trace(steps(rng, startup(rng), h, lambda i: lognormal(rng, 15 + 60 * min(i / n, 1), 0.3)), 1)


def _misses(rng: random.Random, h: float) -> Trace:
    return replace(_fast(rng, h), miss=0.03)


SCENARIOS = [
    Scenario("fast steps (20 s, σ 0.25), logging every 10, saves", True, _fast),
    Scenario("slow steps (45 s, σ 0.35), logging every 10, saves", True, _slow),
    Scenario("slow rewards (200–400 s per step)", True, _rewards),
    Scenario("evaluations of 10–25 min every 100 steps", True, _evals),
    Scenario("checkpoint saves of 5–25 min every 50 steps", True, _saves),
    Scenario("100 GB download at 20–60 MB/s with pauses, 10-min load", True, _download),
    Scenario("step time growing 15 s → 75 s (longer completions)", True, _growing),
    Scenario("fast steps, 3 % of scrapes missed (bursts)", True, _misses),
    Scenario("a reward function blocks forever", False, lambda r, h: hang(_rewards(r, h), r, C.PHASE_REWARDS, 7200)),
    Scenario("one rank SIGSTOPped", False, lambda r, h: hang(_fast(r, h), r, C.PHASE_GENERATING, 7200, stopped=1)),
    Scenario("a collective hangs in the optimizer step", False,
             lambda r, h: hang(_slow(r, h), r, C.PHASE_TRAINING, 7200)),
    Scenario("the download freezes", False, lambda r, h: hang(_download(r, h), r, C.PHASE_LOADING, 300)),
    Scenario("a checkpoint save hangs", False, lambda r, h: hang(_saves(r, h), r, C.PHASE_SAVING, 3600)),
    Scenario("an evaluation hangs", False, lambda r, h: hang(_evals(r, h), r, C.PHASE_EVALUATING, 3600)),
]


# ---------------------------------------------------------------------------------------------- the replay
def find_stall_before(w: StallWatch, now: dt.datetime, policy: StallPolicy) -> Optional[Stall]:
    """The earlier rules on today's code: a silent pod past its limit, else every rank's heartbeat judged (its pod
    silent or not), else the step deadline from the step itself (no save's end)."""
    silent = silent_or_frozen(replace(w, ranks=()), now, policy)
    return silent or find_stall(replace(w, unanswered=(), paused_seen=None), now, None, DDP, policy)



@dataclass
class Cursor:
    """Walks the segments in time order; counts the steps done."""

    segs: list[Seg]
    k: int = 0
    done: int = 0

    def at(self, t: float) -> Seg:
        while self.k + 1 < len(self.segs) and self.segs[self.k].end <= t:
            self.done += self.segs[self.k].step_after
            self.k += 1
        return self.segs[self.k]


def replay(trace: Trace, rng: random.Random, hours: float, mode: str) -> Optional[tuple[float, str]]:
    """The first stall find_stall reports over the trace (time, message), or None."""
    policy = StallPolicy() if mode == "now" else replace(StallPolicy(), evaluate=0.0)
    tracker, key = StallTracker(policy), ("ns", "job")
    cursors = [Cursor(trace.segs), Cursor(trace.segs)]
    missing = [False, False]
    stop_at = trace.hang_at if trace.stopped_rank is not None else None
    t = 0.0
    end = min(hours * 3600, (trace.hang_at or math.inf) + 4 * 3600)
    while t < end:
        t += SCRAPE + rng.uniform(-0.5, 0.5)
        now = T0 + dt.timedelta(seconds=t)
        results: list[tuple[str, Optional[progress_mod.Scrape]]] = []
        logged: Optional[int] = None
        for r, cur in enumerate(cursors):
            missing[r] = rng.random() < (trace.burst if missing[r] else trace.miss)
            stopped = stop_at is not None and r == trace.stopped_rank and t >= stop_at
            seg = cur.at(min(t, stop_at) if stopped else t)
            beat = (min(t, stop_at) if stopped else t) // C.HEARTBEAT_SECONDS * C.HEARTBEAT_SECONDS
            step = cur.done
            fetched = None
            if seg.phase == C.PHASE_LOADING and mode == "now":
                fetched = seg.bytes_from + seg.rate * (min(t, seg.end) - seg.start)
            if seg.phase != C.PHASE_LOADING and r == 0:
                logged = step - step % trace.logging_steps
            sample = progress_mod.RankSample(r, seg.phase, seg.start, beat, step if mode == "now" else None, fetched)
            answered = not missing[r] and not stopped  # a stopped local rank 0 serves no /metrics
            results.append((f"job-node-{r}", progress_mod.Scrape(f"job-node-{r}", r == 0, ranks=(sample,))
                            if answered else None))
        if results[0][1] is None:
            logged = None  # rank 0's pod did not answer: no logged step this round
        tracker.observe(key, 0, results, logged, now)
        w = tracker.watch(key)
        if w is None:
            continue
        stall = find_stall(w, now, None, DDP, policy) if mode == "now" else find_stall_before(w, now, policy)
        if stall is not None:
            return t, f"{stall.reason}: {stall.message[:110]}"
    return None


def run(seeds: int, hours: float) -> int:
    print(f"{seeds} traces × {hours:g} h per scenario, a scrape every {SCRAPE:g} s, default thresholds "
          f"({StallPolicy()})\n")
    print("| scenario | job | before | now |")
    print("|---|---|---|---|")
    bad, examples = 0, []
    for sc in SCENARIOS:
        cells = {}
        for mode in ("before", "now"):
            early, late, first = 0, [], None
            for seed in range(seeds):
                trace = sc.build(random.Random(seed), hours)
                got = replay(trace, random.Random(seed + 10_000), hours, mode)
                if got is not None and (trace.hang_at is None or got[0] < trace.hang_at):
                    early += 1  # a false positive: stalled while healthy (or before the hang)
                    first = first or got
                elif got is not None and trace.hang_at is not None:
                    late.append(got[0] - trace.hang_at)
            cell = f"{early}/{seeds} stalled while healthy" if sc.healthy or early else ""
            if not sc.healthy:
                missed = seeds - early - len(late)
                found = f"found {len(late)}/{seeds}" + (f" after {min(late):.0f}–{max(late):.0f} s "
                                                         f"(median {statistics.median(late):.0f} s)" if late else "")
                cell = "; ".join(c for c in (cell, found, f"{missed} missed" if missed else "") if c)
                bad += missed if mode == "now" else 0
            bad += early if mode == "now" else 0
            cells[mode] = cell
            if first is not None:
                examples.append(f"- {sc.name} ({mode}), at {first[0] / 3600:.1f} h: {first[1]}")
        print(f"| {sc.name} | {'healthy' if sc.healthy else 'hung'} | {cells['before']} | {cells['now']} |")
    print("\nFirst false positive of each:\n" + "\n".join(examples) if examples else "\nNo false positive.")
    return 1 if bad else 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--hours", type=float, default=12.0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rc = run(a.seeds, a.hours)
    print(f"\n{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
