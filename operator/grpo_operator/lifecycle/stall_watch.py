"""What the lifecycle knows of a running attempt's trainers (StallWatch, filled by the controller's scraper), the
stacks it asked for (StackRequest → StackDump) and the operator's stall defaults (StallPolicy): data only, read by
lifecycle/stall.py."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Optional

DDP_TIMEOUT_DEFAULT = 1800  # transformers' TrainingArguments.ddp_timeout


@dataclass(frozen=True)
class StallPolicy:
    """Operator-wide defaults (settings: GRPO_STALL_*); a job's runPolicy.stallTimeoutSeconds replaces the derived
    step deadline."""

    floor: float = 300.0  # the least derived step deadline (seconds)
    multiple: float = 10.0  # × the slowest recent step
    startup: float = 1800.0  # before the attempt's first step: download, model load, vLLM start
    save: float = 1800.0  # a rank in the saving phase
    evaluate: float = 3600.0  # a rank in the evaluating phase (generation over the eval split: no step moves)
    heartbeat: float = 60.0  # a rank's heartbeat unchanged this long is frozen (it ticks every 2 s)
    unanswered: float = 120.0  # a running pod's metrics endpoint silent this long (after it once answered)
    ddp_margin: float = 120.0  # derived deadlines stay this far under training.ddpTimeout
    stack_wait: float = 30.0  # how long the stacks are waited for before onStall acts anyway


@dataclass(frozen=True)
class RankBeat:
    """One training process as its node's metrics endpoint last showed it."""

    rank: int
    pod: str
    phase: Optional[str]
    since: Optional[float]  # the trainer's unix time it entered the phase
    beat_moved: _dt.datetime  # operator time its heartbeat was last seen to change
    step: Optional[int] = None
    download_moved: Optional[_dt.datetime] = None  # operator time its download was last seen to grow (loading)


@dataclass(frozen=True)
class RankStack:
    rank: int
    dumped: bool
    phase: Optional[str]
    text: str  # faulthandler's output (most recent call first)


@dataclass(frozen=True)
class StackDump:
    """The answer of every pod's POST /stacks for one attempt."""

    attempt: int
    ranks: tuple[RankStack, ...]
    unanswered: tuple[str, ...] = ()  # pods whose endpoint did not answer the request


@dataclass(frozen=True)
class StallWatch:
    """What the scraper saw of the current attempt's trainers."""

    attempt: int
    watching_since: _dt.datetime  # the first scrape of this attempt
    step: Optional[int] = None
    step_moved: Optional[_dt.datetime] = None  # when this attempt's step last advanced (None: no step yet)
    step_seconds: tuple[float, ...] = ()  # recent seconds per step (the job's history, across attempts)
    ranks: tuple[RankBeat, ...] = ()
    unanswered: tuple[tuple[str, _dt.datetime], ...] = ()  # (pod, silent since) of pods that answered before
    stacks: Optional[StackDump] = None
    paused_seen: Optional[_dt.datetime] = None  # the last scrape that saw a rank saving or evaluating (no step moves)


@dataclass(frozen=True)
class StackRequest:
    """Decision.dump_stacks: ask every trainer pod of `attempt` for its stacks."""

    attempt: int
