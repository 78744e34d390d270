"""What is progress though no step moves (the false positives bench/stall_bench.py found, each a healthy job that was
Stalled and restarted): a download that moves, an evaluation, the end of a checkpoint save, a pod that misses scrapes.

A download that moves is progress (issue 28: "a download in progress is progress"). Before an attempt's first step
the start-up allowance (30 min) counts from the last time a rank's Hub download grew, so a 100 GB model fetched at
40 MB/s (about 45 min) is never Stalled while its bytes still arrive, and a download that froze is, 30 min after its
last byte. The staging pod (spec.cache) runs before any trainer exists: never a stall, however long. And an
evaluation, during which no step moves, has its own allowance like a checkpoint save.

Finding (before this change): the allowance counted from the attempt's first scrape only, so a large model that
downloads in the trainer (no spec.cache) slower than 30 min was Stalled and restarted mid-download — and again on
every attempt until backoffLimit (test_a_long_download_that_moves_is_never_stalled fails on that code)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.api.status import ConditionType, StallReason
from grpo_operator.controller.stalls import StallTracker
from grpo_operator.lifecycle import decision as d
from grpo_operator.lifecycle import progress as progress_mod
from grpo_operator.lifecycle.stall import detect_stall, find_stall
from grpo_operator.lifecycle.stall_watch import RankBeat, StallPolicy, StallWatch
from grpo_trainer import contract as C
from grpo_trainer import phases
from grpo_trainer.metrics import TrainerMetrics
from tests.support.jobs import job_body, pod_body

T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
P = StallPolicy()  # start-up 1800 s, heartbeat 60 s


def ago(seconds: float) -> dt.datetime:
    return T0 - dt.timedelta(seconds=seconds)


def rank(r: int, phase: str = C.PHASE_LOADING, grew: Optional[float] = None) -> RankBeat:
    return RankBeat(r, f"job-node-{r}", phase, 100.0, ago(1), None, ago(grew) if grew is not None else None)


def before_first_step(*ranks: RankBeat, watching: float = 3 * 3600) -> StallWatch:
    return StallWatch(0, ago(watching), None, None, (), ranks)


# ------------------------------------------------------------------------------------------------ the rule
@pytest.mark.parametrize("case, w, stalled", [
    ("3 h of a download whose bytes grew 20 s ago", before_first_step(rank(0, grew=20), rank(1, grew=20)), False),
    ("one node still downloads, the other waits for it at the barrier",
     before_first_step(rank(0), rank(1, grew=20)), False),
    ("downloaded 25 min ago, then 25 min of model load and vLLM start",
     before_first_step(rank(0, C.PHASE_GENERATING, grew=1500), rank(1, grew=1500)), False),
    ("the download froze 31 min ago", before_first_step(rank(0, grew=1860), rank(1, grew=1860)), True),
    ("no download at all (a local model) and no step after 31 min",
     before_first_step(rank(0), rank(1), watching=1860), True),
    ("a download counts only before the first step: a stuck step is stuck",
     StallWatch(0, ago(7200), 5, ago(400), (25.0,), (rank(0, C.PHASE_REWARDS, grew=10), rank(1, grew=10))), True),
])
def test_the_start_up_allowance_counts_from_the_last_byte(case: str, w: StallWatch, stalled: bool) -> None:
    got = find_stall(w, T0, None, 1800, P)
    assert (got is not None) == stalled, (case, got)
    if got is not None and w.step_moved is None and any(r.download_moved for r in w.ranks):
        assert got.reason == StallReason.LOADING and "since the download last grew" in got.message, got


def test_a_frozen_rank_is_not_rescued_by_a_peers_download() -> None:
    frozen = RankBeat(1, "job-node-1", C.PHASE_LOADING, 100.0, ago(70), None, None)
    got = find_stall(before_first_step(rank(0, grew=5), frozen), T0, None, 1800, P)
    assert got is not None and got.ranks == (1,) and "heartbeat frozen" in got.message


# ------------------------------------------------------------------------------------------------ end to end (pure)
def _blob(cache: Path, repo: str, name: str, size: int) -> None:
    blobs = cache / f"models--{repo}" / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    with open(blobs / name, "ab") as f:
        f.write(b"\0" * (size - (os.path.getsize(blobs / name) if (blobs / name).exists() else 0)))


def _scrape(beats: Path, pod: str) -> progress_mod.Scrape:
    m = TrainerMetrics(global_rank0=True)
    m.watch_ranks(str(beats))
    return progress_mod.parse_metrics(m.text(), pod)


def test_a_long_download_that_moves_is_never_stalled(tmp_path: Path) -> None:
    """The trainer's heartbeat carries its Hub cache's bytes while it loads (a partial blob grows in place); the
    node's /metrics serves them; the scraper's tracker sees them grow; find_stall counts from the last growth. Three
    hours of a download that grows each scrape: no stall; then the bytes stop: Stalled 30 min later, not before."""
    cache, beats = tmp_path / "hub", tmp_path / "beats"
    ticks = iter(range(10**6))  # the trainer's clock: each publish is a new heartbeat (its thread is alive)
    clock = phases.PhaseClock(0, directory=str(beats), downloaded=lambda: phases.downloaded_bytes(str(cache)),
                              clock=lambda: float(next(ticks)))
    tracker, key = StallTracker(P), ("ns", "job")
    start = T0 - dt.timedelta(hours=4)
    for i in range(0, 3 * 3600 // 15):  # a scrape every 15 s for 3 h; the partial blob grows 1 MB-ish each time
        _blob(cache, "org--big", "abc.incomplete", 1000 * (i + 1))
        clock.publish()
        now = start + dt.timedelta(seconds=15 * i)
        tracker.observe(key, 0, [("job-node-0", _scrape(beats, "job-node-0"))], None, now)
        w = tracker.watch(key)
        assert w is not None and find_stall(w, now, None, 1800, P) is None, f"stalled at {15 * i} s of downloading"
    last = now
    for extra in (60, 1200, 1790):  # frozen bytes, the heartbeat still ticking (the thread is alive)
        clock.publish()
        tracker.observe(key, 0, [("job-node-0", _scrape(beats, "job-node-0"))], None, last + dt.timedelta(seconds=extra))
    w = tracker.watch(key)
    assert w is not None and find_stall(w, last + dt.timedelta(seconds=1790), None, 1800, P) is None
    got = find_stall(w, last + dt.timedelta(seconds=1810), None, 1800, P)
    assert got is not None and got.reason == StallReason.LOADING and "since the download last grew" in got.message


def test_the_download_bytes_are_published_only_while_loading(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    _blob(cache, "org--a", "x", 300)
    _blob(cache, "org--b", "y.incomplete", 200)
    (cache / "models--org--a" / "snapshots").mkdir()  # links and refs are not counted twice
    clock = phases.PhaseClock(0, downloaded=lambda: phases.downloaded_bytes(str(cache)))
    assert clock.record()["download_bytes"] == 500
    clock.set(C.PHASE_TRAINING)
    assert "download_bytes" not in clock.record()
    assert phases.downloaded_bytes(str(tmp_path / "none")) is None


@pytest.mark.parametrize("env, want", [
    ({"HF_HUB_CACHE": "/c/hub", "HF_HOME": "/h"}, "/c/hub"),
    ({"HF_HOME": "/h"}, "/h/hub"),
    ({"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub"),
])
def test_the_hub_cache_is_where_huggingface_hub_downloads(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                          want: str) -> None:
    for k in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert phases.hub_cache() == want


def test_the_tracker_counts_growth_not_a_first_sighting_nor_a_gap() -> None:
    def scrape(b: Optional[float]) -> progress_mod.Scrape:
        return progress_mod.Scrape("p", True, ranks=(progress_mod.RankSample(0, "loading", 1.0, 1.0, 0, b),))

    t, key = StallTracker(P), ("ns", "job")
    t.observe(key, 0, [("p", scrape(5e9))], None, ago(300))  # a warm cache: 5 GB already there, nothing moved
    assert t.watch(key).ranks[0].download_moved is None  # type: ignore[union-attr]
    t.observe(key, 0, [("p", scrape(6e9))], None, ago(200))
    t.observe(key, 0, [("p", scrape(None))], None, ago(100))  # a record read between two writes: no value
    t.observe(key, 0, [("p", scrape(6e9))], None, ago(50))  # the same bytes: no movement
    assert t.watch(key).ranks[0].download_moved == ago(200)  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------------ the staging pod
def test_a_slow_staging_pod_is_never_a_stall() -> None:
    """spec.cache: the download pod runs while the job is Pending and no trainer exists; even a watch left over
    with no step for hours does not make detect_stall act."""
    status = {"phase": "Pending", "conditions": [{"type": "Staged", "status": "False", "reason": "Staging",
                                                  "message": "model: 40.0/140.0 GB", "lastTransitionTime":
                                                  "2030-01-01T09:00:00Z"}]}
    body = job_body("job", uid="uid-1", status=status, nodes=2)
    view = lc.JobView.from_body(body)
    view.stall = before_first_step(rank(0), rank(1), watching=3 * 3600)
    stager = pod_body("job", 0, "Running")
    stager["metadata"]["labels"]["grpo.dev/role"] = "initializer"
    dr = d.Draft.begin(view, [lc.summarize_pod(stager)], T0, lc.Policy())
    assert detect_stall(dr) is False
    assert dr.decision.dump_stacks is None and dr.found.condition(ConditionType.STALLED) is None


# ------------------------------------------------------------------------------------------------ evaluation
@pytest.mark.parametrize("case, phase, quiet, stalled", [
    ("a 25-min evaluation after 30-s steps", C.PHASE_EVALUATING, 1500, False),
    ("an evaluation past its allowance", C.PHASE_EVALUATING, 3700, True),
    ("the same 25 min in training", C.PHASE_TRAINING, 1500, True),
])
def test_an_evaluation_has_its_own_allowance(case: str, phase: str, quiet: float, stalled: bool) -> None:
    """Finding (bench/stall_bench.py): no step moves while TRL evaluates (generation over the eval split); the first
    evaluation longer than 10 × the slowest step was Stalled."""
    w = StallWatch(0, ago(7200), 100, ago(quiet), (30.0,), (rank(0, phase), rank(1, phase)))
    got = find_stall(w, T0, None, 1800, P)
    assert (got is not None) == stalled, (case, got)


# ------------------------------------------------------------------------------------------------ after a save
@pytest.mark.parametrize("case, paused, stalled, words", [
    ("20 min of saving ended 20 s ago; the step deadline (300 s) starts again", 20, False, ""),
    ("the save ended 400 s ago and no step since", 400, True, "since the last save or evaluation"),
    ("no save at all: 1000 s since the step", None, True, "step 100 for 1000s"),
])
def test_after_a_save_or_an_evaluation_the_step_deadline_starts_again(case: str, paused: Optional[float],
                                                                       stalled: bool, words: str) -> None:
    """Finding: the deadline counted from the step before the save, so when a save longer than the step deadline
    ended, the job was Stalled at the next scrape, in generation."""
    w = StallWatch(0, ago(7200), 100, ago(1000), (30.0,), (rank(0, C.PHASE_GENERATING), rank(1, C.PHASE_GENERATING)),
                   paused_seen=ago(paused) if paused is not None else None)
    got = find_stall(w, T0, None, 1800, P)
    assert (got is not None) == stalled, (case, got)
    assert got is None or words in got.message, got


def test_a_pod_that_misses_scrapes_is_judged_by_the_silence_limit() -> None:
    """Finding: a pod that missed 4 scrapes in a row (60 s at the default interval) had its ranks' heartbeats
    "frozen" and the job restarted; its heartbeats are unknown while it is silent, and the silence limit (120 s)
    judges the pod."""
    quiet = RankBeat(1, "job-node-1", C.PHASE_TRAINING, 100.0, ago(75), None, None)
    w = StallWatch(0, ago(7200), 100, ago(10), (30.0,), (rank(0, C.PHASE_TRAINING), quiet),
                   (("job-node-1", ago(74)),))
    assert find_stall(w, T0, None, 1800, P) is None
    late = find_stall(w, T0 + dt.timedelta(seconds=50), None, 1800, P)
    assert late is not None and late.reason == StallReason.METRICS_UNANSWERED and late.pods == ("job-node-1",)


def test_only_the_jobs_own_repos_are_measured(tmp_path: Path) -> None:
    """The heartbeat thread measures the download: a shared cache's other repos are not listed at each tick."""
    cache = tmp_path / "hub"
    _blob(cache, "org--mine", "a.incomplete", 700)
    _blob(cache, "org--other", "b", 10_000)
    folders = phases.hub_folders("org/mine", "/models/local", None, datasets=("/data/x.jsonl",))
    assert folders == ("models--org--mine",)
    assert phases.downloaded_bytes(str(cache), folders) == 700
    assert phases.hub_folders("/models/tiny", datasets=("/data/arithmetic.jsonl",)) == ()  # nothing to download
