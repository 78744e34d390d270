"""Hung jobs (pure): a running attempt whose step has not advanced past its deadline, one of whose ranks has a frozen
heartbeat, or whose metrics endpoint stopped answering is Stalled; its stacks are asked for, then runPolicy.onStall.

The controller's scraper watches the trainers (StallWatch: the step and when it last moved, each rank's phase and
heartbeat, the endpoints that stopped answering, the stacks once dumped); this module only compares that with the
clock it is given. The deadline: runPolicy.stallTimeoutSeconds, else a multiple of the slowest recent step, never
below a floor and kept under torch's collective timeout (training.ddpTimeout) so the operator, not torch, ends a hung
collective, with its stacks. Before the attempt's first step, during a checkpoint save and during an evaluation a
longer allowance holds; before the first step it counts from the last time a rank's download grew (a download that
moves is progress).
Pending pods are never stalled (that is scheduling); a slow job whose steps move never is. docs/operator.md#stalls.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Optional

from grpo_trainer import contract

from ..api.status import ConditionType, Phase, Reason, StallReason
from .conditions import parse_time
from .draft import Draft, JobEvent
from .pods import ROLE_TRAINER, Failure, PodPhase
from .restart import restart_for
from .stall_watch import DDP_TIMEOUT_DEFAULT, StackDump, StackRequest, StallPolicy, StallWatch
from .terminal import fail

__all__ = ["DDP_TIMEOUT_DEFAULT", "StackDump", "StackRequest", "StallPolicy", "StallWatch", "detect_stall",
           "find_stall", "innermost_frames", "step_deadline"]


@dataclass(frozen=True)
class Stall:
    reason: StallReason
    message: str
    ranks: tuple[int, ...] = ()
    pods: tuple[str, ...] = ()


@dataclass(frozen=True)
class Deadline:
    seconds: float
    why: str


# ---------------------------------------------------------------------------------------------- deadlines
def step_deadline(explicit: Optional[int], history: tuple[float, ...], ddp_timeout: float,
                  policy: StallPolicy) -> Deadline:
    """How long a step may take: runPolicy.stallTimeoutSeconds, else max(floor, multiple × slowest recent step),
    kept under torch's collective timeout when that leaves more than the floor."""
    if explicit is not None:
        return Deadline(float(explicit), "runPolicy.stallTimeoutSeconds")
    slowest = max(history) if history else 0.0
    seconds, why = policy.floor, f"the floor {policy.floor:g}s"
    if policy.multiple * slowest > policy.floor:
        seconds, why = policy.multiple * slowest, f"{policy.multiple:g}× the slowest recent step ({slowest:.1f}s)"
    cap = ddp_timeout - policy.ddp_margin
    if cap >= policy.floor and seconds > cap:
        seconds, why = cap, f"training.ddpTimeout {ddp_timeout:g}s less {policy.ddp_margin:g}s"
    return Deadline(seconds, why)


def reason_of(phase: Optional[str]) -> StallReason:
    names = {p: p.title().replace("-", "").replace("_", "") for p in contract.PHASES}
    try:
        return StallReason(names[phase]) if phase in names else StallReason.UNKNOWN_PHASE
    except ValueError:
        return StallReason.UNKNOWN_PHASE


def last_progress(watch: StallWatch) -> tuple[_dt.datetime, str]:
    """Since when nothing moved: the step's last advance or the end of a save or an evaluation; before the first
    step, the attempt's first scrape or the last time a rank's download grew, whichever is later (a download that
    moves is progress, however long); and what it was, for the message."""
    if watch.step_moved is not None:  # after a save or an evaluation the step's deadline starts again
        if watch.paused_seen is not None and watch.paused_seen > watch.step_moved:
            return watch.paused_seen, " since the last save or evaluation"
        return watch.step_moved, ""
    fetched = max((r.download_moved for r in watch.ranks if r.download_moved is not None), default=None)
    if fetched is not None and fetched > watch.watching_since:
        return fetched, " since the download last grew"
    return watch.watching_since, ""


def silent_or_frozen(watch: StallWatch, now: _dt.datetime, policy: StallPolicy) -> Optional[Stall]:
    """An endpoint silent past its limit, else a rank whose heartbeat did not move past its limit in the scrapes its
    pod answered (a pod that misses scrapes has heartbeats unknown, not frozen: the silence limit judges it)."""
    for pod, since in watch.unanswered:
        silent = (now - since).total_seconds()
        if silent >= policy.unanswered:
            return Stall(StallReason.METRICS_UNANSWERED, f"pod {pod}'s metrics endpoint has not answered for "
                         f"{silent:.0f}s while the pod runs", pods=(pod,))
    quiet = {pod for pod, _ in watch.unanswered}
    for r in watch.ranks:
        frozen = (now - r.beat_moved).total_seconds()
        if frozen >= policy.heartbeat and r.phase != contract.PHASE_DONE and r.pod not in quiet:  # done: exiting
            return Stall(reason_of(r.phase), f"rank {r.rank} (pod {r.pod}) in phase {r.phase}: heartbeat frozen for "
                         f"{frozen:.0f}s (the process is stopped or its interpreter blocked)", (r.rank,), (r.pod,))
    return None


def find_stall(watch: StallWatch, now: _dt.datetime, explicit: Optional[int], ddp_timeout: float,
               policy: StallPolicy) -> Optional[Stall]:
    """The stall of a running attempt, or None. First a rank whose heartbeat froze (its process stopped) or an
    endpoint that went silent, then the step past its deadline (the rank in its phase longest is the suspect)."""
    frozen = silent_or_frozen(watch, now, policy)
    if frozen is not None:
        return frozen
    started = watch.step_moved is not None
    anchor, after = last_progress(watch)
    if any(r.phase in (contract.PHASE_SAVING, contract.PHASE_EVALUATING) for r in watch.ranks):
        anchor, after = watch.step_moved or anchor, ""  # the allowance counts from the step before the save
    waited = (now - anchor).total_seconds()
    step = step_deadline(explicit, watch.step_seconds, ddp_timeout, policy)
    limit = step if started else Deadline(max(step.seconds, policy.startup), "the start-up allowance")
    for phase, allowance, why in ((contract.PHASE_SAVING, policy.save, "the checkpoint-save allowance"),
                                  (contract.PHASE_EVALUATING, policy.evaluate, "the evaluation allowance")):
        if any(r.phase == phase for r in watch.ranks) and allowance > limit.seconds:
            limit = Deadline(allowance, why)
    if waited < limit.seconds:
        return None
    suspect = min(watch.ranks, key=lambda r: r.since if r.since is not None else float("inf"), default=None)
    what = f"step {watch.step}" if started else "no first step"
    msg = f"{what} for {waited:.0f}s{after} (deadline {limit.seconds:.0f}s: {limit.why})"
    if suspect is None:
        return Stall(StallReason.UNKNOWN_PHASE, msg)
    phases = ", ".join(f"rank {r.rank} {r.phase}" for r in sorted(watch.ranks, key=lambda r: r.rank))
    return Stall(reason_of(suspect.phase), f"{msg}; {phases}; rank {suspect.rank} (pod {suspect.pod}) longest in "
                 f"its phase", (suspect.rank,), (suspect.pod,))


# ---------------------------------------------------------------------------------------------- stacks
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def innermost_frames(text: str, count: int = 5) -> list[str]:
    """The first `count` frames of the thread that runs the trainer (the one whose stack reaches grpo_trainer or
    runpy; else the deepest), most recent first, as "func (file:line)"."""
    threads: list[list[str]] = []
    for line in text.splitlines():
        if "most recent call first" in line:
            threads.append([])
        elif threads and (m := _FRAME.match(line)):
            threads[-1].append(f"{m['func']} ({m['file'].rsplit('/', 1)[-1]}:{m['line']})")
    if not threads:
        return []
    main = [t for t in threads if any("runpy" in f or "__main__" in f for f in t)]
    return (main[-1] if main else max(threads, key=len))[:count]


def stacks_summary(dump: StackDump, suspects: tuple[int, ...]) -> str:
    """The suspect's innermost frames, else (a stopped process dumps nothing) a live rank's: where it waits."""
    by_rank = {s.rank: s for s in dump.ranks}
    parts = []
    for rank in suspects:
        s = by_rank.get(rank)
        if s is None or not s.dumped:
            parts.append(f"rank {rank} dumped no stacks (stopped or gone)")
    for rank in list(suspects) + sorted(r for r in by_rank if r not in suspects):
        s = by_rank.get(rank)
        frames = innermost_frames(s.text) if s is not None and s.dumped else []
        if frames:
            parts.append(f"rank {rank} in {s.phase if s else '?'} at " + " < ".join(frames))
            break
    if dump.unanswered:
        parts.append("no answer from " + ", ".join(dump.unanswered))
    return "; ".join(parts) or "no stacks"


# ---------------------------------------------------------------------------------------------- the step
def _running(draft: Draft) -> bool:
    trainers = [p for p in draft.pods.current if p.role == ROLE_TRAINER]
    return (draft.phase == Phase.RUNNING and len(trainers) >= draft.nodes
            and all(p.phase == PodPhase.RUNNING and p.live for p in trainers))


def detect_stall(draft: Draft) -> bool:
    """A running attempt that stalled: Stalled (reason: the phase), its stacks asked for; once they are in (or after
    stack_wait), a Warning Event with the innermost frames and runPolicy.onStall: Restart (a gang restart counted
    against backoffLimit, from the checkpoint), Fail, or Ignore (the condition only). A moving step clears it."""
    watch = draft.job.stall
    if watch is None or watch.attempt != draft.pods.attempt or not _running(draft):
        return False
    run = draft.spec.runPolicy
    ddp = getattr(draft.spec.training, "ddpTimeout", None) or DDP_TIMEOUT_DEFAULT
    stall = find_stall(watch, draft.now, run.stallTimeoutSeconds, float(ddp), draft.policy.stall)
    found = draft.found.condition(ConditionType.STALLED)
    if stall is None:
        if found is not None and found.status == "True":
            draft.clear(ConditionType.STALLED, Reason.PROGRESSING, f"training moves again (step {watch.step})")
        return False
    dump = watch.stacks if watch.stacks is not None and watch.stacks.attempt == watch.attempt else None
    since = found.lastTransitionTime if found is not None and found.status == "True" else None
    asked_at = parse_time(since) if since else None
    asked_for = (draft.now - asked_at).total_seconds() if asked_at is not None else 0.0
    if dump is None and asked_for < draft.policy.stall.stack_wait:
        draft.set(ConditionType.STALLED, "True", stall.reason, f"{stall.message}; dumping every rank's stacks")
        draft.decision.dump_stacks = StackRequest(watch.attempt)
        draft.decision.requeue(max(draft.policy.stall.stack_wait - asked_for, 1.0))
        return False
    where = stacks_summary(dump, stall.ranks) if dump is not None else "the stacks did not arrive in time"
    files = f"{contract.STALLS_DIR}/attempt-{watch.attempt}/ on the output volume"
    message = f"{stall.message}; {where}; stacks in {files}"
    draft.set(ConditionType.STALLED, "True", stall.reason, message)
    return _on_stall(draft, run.onStall, stall, message, first=found is None or found.message != message)


def _on_stall(draft: Draft, action: str, stall: Stall, message: str, *, first: bool) -> bool:
    if first or action != "Ignore":
        draft.decision.events.append(_event(f"{stall.reason}: {message}"))
    if action == "Fail":
        draft.status.lastFailureReason = Reason.STALLED
        return fail(draft, Reason.STALLED, f"stalled ({stall.reason}): {message}")
    if action == "Restart":
        attempt = draft.pods.attempt
        settled = restart_for(draft, [Failure(True, Reason.STALLED, f"stalled in {stall.reason}: {stall.message}")])
        if draft.status.phase == Phase.RESTARTING:  # the new attempt is not stalled (yet): the diagnosis stays here
            draft.clear(ConditionType.STALLED, Reason.STALLED, f"attempt {attempt} stalled and was restarted: {message}")
        return settled
    return False


def _event(message: str) -> JobEvent:
    return JobEvent("Warning", Reason.STALLED, message[:1000])
