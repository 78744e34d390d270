"""Hung jobs (lifecycle/stall.py): the deadlines derived from the job's own step times, the start-up and save
allowances, a frozen rank, a silent endpoint; and what detect_stall does with a stalled attempt (Stalled, the stacks
asked for, then runPolicy.onStall) — Pending pods and a slow job whose steps move are never stalled."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.api.status import ConditionType, Phase, Reason, StallReason
from grpo_operator.lifecycle import decision as d
from grpo_operator.lifecycle.stall import detect_stall, find_stall, innermost_frames, step_deadline
from grpo_operator.lifecycle.stall_watch import RankBeat, RankStack, StackDump, StallPolicy, StallWatch
from tests.support.jobs import job_body
from tests.support.lifecycle import T0, UID, pod

P = StallPolicy()  # floor 300, ×10, start-up 1800, save 1800, heartbeat 60, unanswered 120, ddp margin 120


def ago(seconds: float) -> dt.datetime:
    return T0 - dt.timedelta(seconds=seconds)


def beat(rank: int, phase: str = "training", moved: float = 1, since: float = 100.0) -> RankBeat:
    return RankBeat(rank, f"job-node-{rank}", phase, since, ago(moved), 5)


def watch(step_moved: Optional[float] = 10, history: tuple[float, ...] = (20.0,), ranks: tuple[RankBeat, ...] = (),
          unanswered: tuple[tuple[str, dt.datetime], ...] = (), watching: float = 3600, attempt: int = 0,
          stacks: Optional[StackDump] = None) -> StallWatch:
    return StallWatch(attempt, ago(watching), 5 if step_moved is not None else None,
                      ago(step_moved) if step_moved is not None else None, history,
                      ranks or (beat(0), beat(1)), unanswered, stacks)


# ------------------------------------------------------------------------------------------------ deadlines
@pytest.mark.parametrize("explicit, history, ddp, seconds, why", [
    (None, (), 1800, 300, "the floor"),                       # no history yet: the floor
    (None, (5.0, 12.0, 8.0), 1800, 300, "the floor"),         # fast steps: still the floor
    (None, (40.0, 90.0), 1800, 900, "10× the slowest"),       # slow steps: 10 × the slowest recent one
    (None, (400.0,), 1800, 1680, "ddpTimeout"),               # kept under torch's collective timeout
    (None, (400.0,), 360, 4000, "10× the slowest"),           # a ddpTimeout under the floor cannot be honoured
    (600, (400.0,), 1800, 600, "stallTimeoutSeconds"),        # the job's own setting wins
])
def test_the_step_deadline(explicit: Optional[int], history: tuple[float, ...], ddp: float, seconds: float,
                           why: str) -> None:
    got = step_deadline(explicit, history, ddp, P)
    assert got.seconds == seconds and why in got.why


@pytest.mark.parametrize("case, w, stalled, reason", [
    ("a slow job whose steps move", watch(step_moved=250, history=(25.0,)), False, None),
    ("step stuck past 10× the slowest step", watch(step_moved=400, history=(25.0,),
                                                   ranks=(beat(0, since=50), beat(1, "rewards", since=10))),
     True, StallReason.REWARDS),
    ("loading for 25 min before the first step", watch(step_moved=None, watching=1500,
                                                       ranks=(beat(0, "loading"), beat(1, "loading"))), False, None),
    ("no first step after the start-up allowance", watch(step_moved=None, watching=1900,
                                                         ranks=(beat(0, "generating"), beat(1, "loading", since=1))),
     True, StallReason.LOADING),
    ("a long checkpoint save", watch(step_moved=1000, ranks=(beat(0, "saving"), beat(1, "saving"))), False, None),
    ("a save past its allowance", watch(step_moved=1900, ranks=(beat(0, "saving"), beat(1, "saving"))),
     True, StallReason.SAVING),
    ("one rank's heartbeat frozen while the other ticks", watch(ranks=(beat(0, moved=1), beat(1, "generating", 70))),
     True, StallReason.GENERATING),
    ("a heartbeat late by less than its timeout", watch(ranks=(beat(0), beat(1, moved=40))), False, None),
    ("a finished rank exiting", watch(ranks=(beat(0), beat(1, "done", moved=90))), False, None),
    ("an endpoint silent for 130 s", watch(unanswered=(("job-node-1", ago(130)),)), True,
     StallReason.METRICS_UNANSWERED),
    ("an endpoint silent for 60 s", watch(unanswered=(("job-node-1", ago(60)),)), False, None),
])
def test_find_stall(case: str, w: StallWatch, stalled: bool, reason: Optional[StallReason]) -> None:
    got = find_stall(w, T0, None, 1800, P)
    assert (got is not None) == stalled, case
    if got is not None:
        assert got.reason == reason, (case, got)


def test_the_message_says_which_rank_how_long_and_why() -> None:
    got = find_stall(watch(step_moved=400, ranks=(beat(0, since=50), beat(1, "rewards", since=10))), T0, None, 1800, P)
    assert got is not None and got.ranks == (1,)
    assert got.message.startswith("step 5 for 400s (deadline 300s: the floor 300s)")
    assert "rank 1 (pod job-node-1) longest in its phase" in got.message


FAULTHANDLER = '''Thread 0x00007f1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/app/grpo_trainer/phases.py", line 120 in tick
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f0 (most recent call first):
  File "/app/my_rewards.py", line 7 in never_returns
  File "/venv/trl/trainer/grpo_trainer.py", line 1620 in _calculate_rewards
  File "/app/grpo_trainer/phases.py", line 210 in call
  File "/app/grpo_trainer/train.py", line 170 in run
  File "/usr/lib/python3.11/runpy.py", line 88 in _run_code
'''


def test_innermost_frames_are_the_training_threads() -> None:
    assert innermost_frames(FAULTHANDLER, 2) == ["never_returns (my_rewards.py:7)",
                                                 "_calculate_rewards (grpo_trainer.py:1620)"]
    assert innermost_frames("garbage") == []


# ------------------------------------------------------------------------------------------------ the step
def running_status(stalled: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    conds = [{"type": "Running", "status": "True", "reason": "AllNodesRunning", "message": "",
              "lastTransitionTime": "2030-01-01T10:00:00Z"}]
    if stalled:
        conds.append({"type": "Stalled", "status": "True", "reason": "Rewards",
                      "lastTransitionTime": "2030-01-01T11:59:50Z", **stalled})
    return {"phase": "Running", "restarts": 0, "startTime": "2030-01-01T10:00:00Z", "conditions": conds}


def step(w: Optional[StallWatch], *, pods: Optional[list[lc.PodInfo]] = None, status: Optional[dict[str, Any]] = None,
         on_stall: str = "Restart", backoff_limit: int = 3, now: dt.datetime = T0) -> tuple[bool, d.Draft]:
    body = job_body("job", uid=UID, status=status or running_status(), nodes=2, backoff_limit=backoff_limit)
    body["spec"]["runPolicy"]["onStall"] = on_stall
    view = lc.JobView.from_body(body)
    view.stall = w
    dr = d.Draft.begin(view, pods if pods is not None else [pod(0), pod(1)], now, lc.Policy())
    return detect_stall(dr), dr


STUCK = watch(step_moved=400, ranks=(beat(0, since=50), beat(1, "rewards", since=10)))
DUMP = StackDump(0, (RankStack(0, True, "training", FAULTHANDLER.replace("never_returns", "all_reduce")),
                     RankStack(1, True, "rewards", FAULTHANDLER)))


def test_the_step_is_listed_before_the_phase_from_pods() -> None:
    assert d.STEPS.index(detect_stall) == d.STEPS.index(d.phase_from_pods) - 1


def test_a_stall_first_asks_for_every_ranks_stacks() -> None:
    settled, dr = step(STUCK)
    assert not settled and dr.decision.dump_stacks is not None and dr.decision.dump_stacks.attempt == 0
    c = dr.condition(ConditionType.STALLED)
    assert c is not None and (c.status, c.reason) == ("True", "Rewards") and "dumping" in c.message
    assert not dr.decision.delete_pods and dr.decision.requeue_after is not None


def test_with_the_stacks_in_a_gang_restart_counted_against_the_backoff_limit() -> None:
    w = watch(step_moved=400, ranks=STUCK.ranks, stacks=DUMP)
    settled, dr = step(w, status=running_status({"message": "…; dumping every rank's stacks"}))
    assert settled and dr.status.phase == Phase.RESTARTING and dr.status.restarts == 1
    assert dr.status.lastFailureReason == Reason.STALLED
    assert sorted(dr.decision.delete_pods) == ["job-node-0", "job-node-1"]
    (ev,) = dr.decision.events
    assert ev.type == "Warning" and ev.reason == "Stalled"
    assert "rank 1 in rewards at never_returns (my_rewards.py:7)" in ev.message
    assert "stalls/attempt-0/" in ev.message
    c = dr.condition(ConditionType.STALLED)
    assert c is not None and "never_returns" in c.message  # what `kubectl grpo describe` shows


def test_a_stopped_rank_dumps_nothing_and_its_live_peer_says_where_it_waits() -> None:
    dump = StackDump(0, (RankStack(0, True, "training", FAULTHANDLER.replace("never_returns", "all_reduce")),
                         RankStack(1, False, "generating", "")))
    w = watch(ranks=(beat(0), beat(1, "generating", moved=90)), stacks=dump)
    settled, dr = step(w, status=running_status({"message": "x"}))
    assert settled and "rank 1 dumped no stacks (stopped or gone); rank 0 in training at all_reduce" \
        in dr.decision.events[0].message


def test_stacks_that_never_come_do_not_hold_the_restart_forever() -> None:
    settled, dr = step(STUCK, status=running_status({"message": "x", "lastTransitionTime": "2030-01-01T11:59:00Z"}))
    assert settled and dr.status.phase == Phase.RESTARTING
    assert "the stacks did not arrive in time" in dr.decision.events[0].message


def test_on_stall_fail_and_a_spent_backoff_limit_fail_the_job() -> None:
    w = watch(step_moved=400, ranks=STUCK.ranks, stacks=DUMP)
    settled, dr = step(w, status=running_status({"message": "x"}), on_stall="Fail")
    assert settled and dr.status.phase == Phase.FAILED and dr.status.lastFailureReason == Reason.STALLED
    settled, dr = step(w, status=running_status({"message": "x"}), backoff_limit=0)
    assert settled and dr.status.phase == Phase.FAILED
    assert dr.condition(ConditionType.FAILED).reason == Reason.BACKOFF_LIMIT_EXCEEDED  # type: ignore[union-attr]


def test_on_stall_ignore_keeps_the_pods_and_sends_the_event_once() -> None:
    w = watch(step_moved=400, ranks=STUCK.ranks, stacks=DUMP)
    settled, dr = step(w, status=running_status({"message": "x"}), on_stall="Ignore")
    assert not settled and not dr.decision.delete_pods and len(dr.decision.events) == 1
    message = dr.condition(ConditionType.STALLED).message  # type: ignore[union-attr]
    settled, dr = step(w, status=running_status({"message": message}), on_stall="Ignore")
    assert not settled and not dr.decision.events


def test_steps_moving_again_clear_the_condition() -> None:
    settled, dr = step(watch(step_moved=5), status=running_status({"message": "x"}), on_stall="Ignore")
    c = dr.condition(ConditionType.STALLED)
    assert not settled and c is not None and (c.status, c.reason) == ("False", Reason.PROGRESSING)


@pytest.mark.parametrize("case, pods, w", [
    ("pods Pending (scheduling, not a stall)", [pod(0), pod(1, "Pending")], STUCK),
    ("no watch (scraping off)", None, None),
    ("the watch of an older attempt", None, watch(step_moved=4000, attempt=3)),
])
def test_never_stalled(case: str, pods: Optional[list[lc.PodInfo]], w: Optional[StallWatch]) -> None:
    settled, dr = step(w, pods=pods)
    assert not settled and dr.condition(ConditionType.STALLED) is None and dr.decision.dump_stacks is None, case


@pytest.mark.parametrize("run, ddp, warned", [
    ({"stallTimeoutSeconds": 1800}, None, True),      # transformers' default ddp_timeout is 1800: torch fires first
    ({"stallTimeoutSeconds": 900}, None, False),
    ({"stallTimeoutSeconds": 3600}, 7200, False),     # ddpTimeout raised above it: the rule followed
    ({"stallTimeoutSeconds": 3600, "onStall": "Ignore"}, None, False),
    ({}, None, False),                                # derived deadlines are kept under ddpTimeout by the operator
])
def test_admission_warns_when_torch_would_kill_a_hung_rank_first(run: dict[str, Any], ddp: Optional[int],
                                                                 warned: bool) -> None:
    from grpo_operator.rules import validation

    body = job_body("job", cpu=True, num_generations=2)
    body["spec"]["runPolicy"].update(run)
    if ddp is not None:
        body["spec"]["training"]["ddpTimeout"] = ddp
    res = validation.validate(body)
    assert res.valid, res.errors
    assert any("ddpTimeout" in w and "stallTimeoutSeconds" in w for w in res.warnings) == warned, res.warnings
