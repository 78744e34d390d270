"""The scraper's side of hung jobs (controller/stalls.py): the trainer's per-rank gauges parse into samples; the
tracker turns scrape rounds into the lifecycle's StallWatch (step times, frozen heartbeats, silent endpoints) and kicks
a reconcile only for a job that looks quiet; a stack dump's answers become a StackDump."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Optional

from grpo_operator.controller.stalls import StallTracker, to_dump
from grpo_operator.lifecycle import progress as progress_mod
from grpo_operator.lifecycle.stall import find_stall, step_deadline
from grpo_operator.lifecycle.stall_watch import StallPolicy
from grpo_trainer import contract as C
from grpo_trainer import phases
from grpo_trainer.metrics import TrainerMetrics

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
KEY = ("ns", "job")


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def sample(rank: int, beat: float, phase: str = "training", step: Optional[int] = None) -> progress_mod.Scrape:
    return progress_mod.Scrape("p", True, ranks=(progress_mod.RankSample(rank, phase, 1.0, beat, step),))


def test_the_trainers_rank_gauges_parse_into_samples(tmp_path: Path) -> None:
    for rank, phase in ((0, C.PHASE_TRAINING), (1, C.PHASE_REWARDS)):
        c = phases.PhaseClock(rank, directory=str(tmp_path))
        c.set(phase)
        c.step = 4
        c.publish()
    m = TrainerMetrics(global_rank0=True)
    m.watch_ranks(str(tmp_path))
    got = progress_mod.parse_metrics(m.text(), "pod-0").ranks
    assert [(r.rank, r.phase, r.step) for r in got] == [(0, "training", 4), (1, "rewards", 4)]
    assert all(r.heartbeat and r.since for r in got)


def test_step_times_frozen_heartbeats_and_silent_endpoints() -> None:
    t = StallTracker(StallPolicy(heartbeat=60))
    t.observe(KEY, 0, [("a", sample(0, 10.0)), ("b", sample(1, 10.0))], None, at(0))
    w = t.watch(KEY)
    assert w is not None and w.step_moved is None and w.watching_since == at(0)  # no step yet: start-up allowance
    t.observe(KEY, 0, [("a", sample(0, 12.0)), ("b", sample(1, 10.0))], 3, at(5))
    t.observe(KEY, 0, [("a", sample(0, 14.0)), ("b", sample(1, 10.0))], 5, at(25))  # 2 steps in 20 s
    t.observe(KEY, 0, [("a", sample(0, 16.0)), ("b", None)], 5, at(70))  # b stops answering
    w = t.watch(KEY)
    assert w is not None and w.step_seconds == (10.0,) and w.step_moved == at(25) and w.step == 5
    beats = {r.rank: r.beat_moved for r in w.ranks}
    assert beats == {0: at(70), 1: at(0)}  # rank 1's heartbeat never changed after the first round
    assert w.unanswered == (("b", at(70)),)
    assert t.suspicious(KEY, at(70))
    # rank 1's pod no longer answers: its heartbeat is unknown, not frozen (bench/stall_bench.py: a pod missing 4
    # scrapes in a row restarted healthy jobs); the silence limit judges it
    assert find_stall(w, at(70), None, 1800, StallPolicy(heartbeat=60)) is None
    stall = find_stall(w, at(190), None, 1800, StallPolicy(heartbeat=60))
    assert stall is not None and stall.pods == ("b",) and "has not answered for 120s" in stall.message
    t.observe(KEY, 0, [("a", sample(0, 18.0)), ("b", sample(1, 10.0))], 5, at(80))  # b answers: still frozen
    w = t.watch(KEY)
    assert w is not None and w.unanswered == ()
    stall = find_stall(w, at(80), None, 1800, StallPolicy(heartbeat=60))
    assert stall is not None and stall.ranks == (1,) and "heartbeat frozen for 80s" in stall.message
    # a new attempt starts over, keeping the job's step times
    t.observe(KEY, 1, [("a", sample(0, 99.0))], 5, at(80))
    w = t.watch(KEY)
    assert w is not None and (w.attempt, w.step_moved, w.step_seconds, w.unanswered) == (1, None, (10.0,), ())


def test_a_job_whose_steps_move_costs_no_extra_reconcile() -> None:
    t = StallTracker()
    for i in range(10):
        t.observe(KEY, 0, [("a", sample(0, float(i)))], i, at(5 * i))
        assert not t.suspicious(KEY, at(5 * i))


def test_the_step_is_the_ranks_own_not_the_logged_one() -> None:
    """Finding (bench/stall_bench.py): the tracker followed the logged step, which moves every loggingSteps (TRL's
    default 10): 40-s steps made 400-s gaps between moves against a 10 × 40 s deadline, and a healthy job was Stalled
    at about every other logging window. Every rank publishes its step at every step: that is the step now; a
    logged step that lags behind it is no step backwards (which would have counted as movement)."""
    t = StallTracker(StallPolicy())
    for i in range(0, 41):  # a step every 40 s; the logged step only every 10
        t.observe(KEY, 0, [("a", sample(0, float(i), step=i))], i - i % 10, at(40 * i))
    w = t.watch(KEY)
    assert w is not None and w.step == 40 and w.step_moved == at(1600)
    assert set(w.step_seconds) == {40.0}  # per step, not per logging window
    assert step_deadline(None, w.step_seconds, 1800, StallPolicy()).seconds == 400  # 10 × 40 s, from the last step
    # loading: its step (0 or the checkpoint's) is no step — the load time must not become a "step time"
    t = StallTracker(StallPolicy())
    t.observe(KEY, 0, [("a", sample(0, 1.0, "loading", step=0))], None, at(0))
    t.observe(KEY, 0, [("a", sample(0, 2.0, "generating", step=0))], None, at(1200))
    t.observe(KEY, 0, [("a", sample(0, 3.0, "generating", step=1))], None, at(1230))
    t.observe(KEY, 0, [("a", sample(0, 4.0, "generating", step=2))], None, at(1260))
    w = t.watch(KEY)
    assert w is not None and w.step_seconds == (30.0, 30.0)


def test_the_stack_answers_become_a_dump() -> None:
    dump = to_dump(2, [("a", {"ranks": {"1": {"dumped": True, "phase": "rewards", "stack": "x"},
                                        "0": {"dumped": False, "phase": "generating", "stack": ""}}}), ("b", None)])
    assert [(r.rank, r.dumped, r.phase) for r in dump.ranks] == [(0, False, "generating"), (1, True, "rewards")]
    assert dump.unanswered == ("b",) and dump.attempt == 2


def test_a_rank_whose_process_exited_is_no_frozen_heartbeat() -> None:
    """Found by the e2e run: a rank that finished first left its last record in the watch, 'frozen', and the job
    was restarted at its very end."""
    t = StallTracker(StallPolicy(heartbeat=60))
    both = progress_mod.Scrape("a", True, ranks=(progress_mod.RankSample(0, "saving", 1.0, 5.0, 60),
                                                 progress_mod.RankSample(1, "done", 1.0, 5.0, 60)))
    t.observe(KEY, 0, [("a", both)], 60, at(0))
    t.observe(KEY, 0, [("a", sample(0, 9.0, "saving", 60))], 60, at(100))
    w = t.watch(KEY)
    assert w is not None and [r.rank for r in w.ranks] == [0]


def test_kubectl_grpo_describe_shows_the_whole_stall_message() -> None:
    from grpo_operator.cli.kubectl_text import describe_text
    from grpo_operator.client.types import Job
    from tests.support.jobs import job_body

    message = "step 5 for 400s (deadline 300s: the floor 300s); " + "x" * 120 + "; rank 1 in rewards at never_returns"
    body = job_body("job", status={"phase": "Running", "conditions": [
        {"type": "Stalled", "status": "True", "reason": "Rewards", "message": message,
         "lastTransitionTime": "2030-01-01T00:00:00Z"}]})
    text = describe_text(Job.from_dict(body), [])
    assert f"Stall:        {message}" in text


def test_a_restart_in_place_gets_the_start_up_allowance_again() -> None:
    """Finding (merge of in-place restarts with stall detection): after the gang restarted in place, new workers
    reload the model and resume below the last step seen; the tracker kept the attempt's step deadline, so a reload
    longer than 10 steps was declared Stalled and the pods recreated. Rank 0's in-place count now starts the record
    anew (the start-up allowance, steps counted from the resumed one), keeping the job's step times."""
    def scrape(beat: float, phase: str, step: int, restarts: int) -> progress_mod.Scrape:
        return progress_mod.Scrape("p", True, values={"inPlaceRestarts": float(restarts)},
                                   ranks=(progress_mod.RankSample(0, phase, 1.0, beat, step),))
    t = StallTracker(StallPolicy())
    for i in range(6):
        t.observe(KEY, 0, [("a", scrape(float(i), "training", i, 0))], None, at(20 * i))
    w = t.watch(KEY)
    assert w is not None and w.step == 5 and w.step_moved == at(100)
    t.observe(KEY, 0, [("a", scrape(50.0, "loading", 4, 1))], None, at(130))  # rank 1 died; all reload
    t.observe(KEY, 0, [("a", scrape(51.0, "loading", 4, 1))], None, at(900))  # 13 min of reload: 10 × 20 s passed
    w = t.watch(KEY)
    assert w is not None and w.step_moved is None and w.watching_since == at(130) and w.step_seconds
    assert find_stall(w, at(900), None, 1800, StallPolicy()) is None
    t.observe(KEY, 0, [("a", scrape(52.0, "training", 5, 1))], None, at(920))  # resumed: step 5 again
    t.observe(KEY, 0, [("a", scrape(53.0, "training", 6, 1))], None, at(940))
    w = t.watch(KEY)
    assert w is not None and w.step == 6 and w.step_moved == at(940)
    stall = find_stall(w, at(940 + 1900), None, 1800, StallPolicy())  # and a hang after it is still found
    assert stall is not None


def test_a_job_whose_first_steps_fell_between_two_scrapes_has_started() -> None:
    """Finding (the stall journey on the real node): the tiny job did its first 3 steps before the operator's first
    scrape and then hung in a reward function; the tracker never saw the step move, kept the 30-minute start-up
    allowance, and no Stalled came in 10 minutes (the floor was 20 s). Each rank now says the step it began training
    at: a step past it is a step this process trained, so the step deadline applies from the first sighting. A
    resumed process reporting its checkpoint's step, no step trained yet, keeps the allowance."""
    policy = StallPolicy(floor=20)

    def scrape(beat: float, step: int, began: Optional[int], phase: str = "rewards") -> progress_mod.Scrape:
        return progress_mod.Scrape("p", True, ranks=(progress_mod.RankSample(0, phase, 1.0, beat, step, None,
                                                                              began),))
    t = StallTracker(policy)
    t.observe(KEY, 0, [("a", scrape(10.0, 3, 0))], None, at(0))  # first sighting: 3 steps already done
    t.observe(KEY, 0, [("a", scrape(12.0, 3, 0))], None, at(30))
    w = t.watch(KEY)
    assert w is not None and w.step_moved == at(0)
    stall = find_stall(w, at(30), None, 1800, policy)
    assert stall is not None and "step 3 for 30s" in stall.message and "the floor 20s" in stall.message
    # a pass to find it comes within half the floor (a floor under 2 min: not a minute later, as with the default)
    assert not t.suspicious(KEY, at(9)) and t.suspicious(KEY, at(10))
    resumed = StallTracker(policy)  # attempt 1 resumed from checkpoint-25: step 25, nothing trained yet
    resumed.observe(KEY, 1, [("a", scrape(10.0, 25, 25, "generating"))], None, at(0))
    resumed.observe(KEY, 1, [("a", scrape(12.0, 25, 25, "generating"))], None, at(300))
    w = resumed.watch(KEY)
    assert w is not None and w.step_moved is None
    assert find_stall(w, at(300), None, 1800, policy) is None  # the start-up allowance (1800 s) still holds


def test_each_rank_publishes_the_step_it_began_training_at(tmp_path: Path) -> None:
    c = phases.PhaseClock(0, directory=str(tmp_path))
    c.publish()
    m = TrainerMetrics(global_rank0=True)
    m.watch_ranks(str(tmp_path))
    assert progress_mod.parse_metrics(m.text(), "pod-0").ranks[0].began_step is None  # still loading
    phases.callback(c).on_train_begin(None, type("S", (), {"global_step": 25})(), None)
    c.step = 27
    c.publish()
    (r,) = progress_mod.parse_metrics(m.text(), "pod-0").ranks
    assert (r.phase, r.step, r.began_step) == ("training", 27, 25)
