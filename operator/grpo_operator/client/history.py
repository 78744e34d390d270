"""A job's training history from the trainer's progress lines (pure: parsing and series; no I/O here).

Global rank 0 prints one `GRPO_PROGRESS {json}` line per logging step. A gang restart deletes every pod of the job,
and their logs with them, so the trainer that resumes from a checkpoint first prints that checkpoint's logged steps
again as `GRPO_HISTORY {json}` lines (from its trainer_state.json, each with the attempt that logged it): the log of
the current attempt carries the whole history up to the checkpoint. Steps an earlier attempt logged after its last
checkpoint were redone by the next one and are only known while that attempt's pod still exists.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

from . import _contract as c

METRICS = ("reward", "kl", "completion_length")


@dataclass(frozen=True)
class Sample:
    """One logging step of one attempt."""

    attempt: int
    step: int
    reward: Optional[float] = None
    rewards: dict[str, Optional[float]] = field(default_factory=dict)  # per reward function: mean
    kl: Optional[float] = None
    completion_length: Optional[float] = None
    replayed: bool = False  # from a GRPO_HISTORY line (a later attempt re-printed it from the checkpoint)

    def as_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "step": self.step, "reward": self.reward, "rewards": dict(self.rewards),
                "kl": self.kl, "completionLength": self.completion_length, "replayed": self.replayed}


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def parse_line(text: str, attempt: int) -> Optional[Sample]:
    """A Sample from a progress or history line of a pod of `attempt`; None for any other line (or a broken one)."""
    text = text.strip()
    if text.startswith(c.PROGRESS_PREFIX):
        body, replayed = text[len(c.PROGRESS_PREFIX):], False
    elif text.startswith(c.HISTORY_PREFIX):
        body, replayed = text[len(c.HISTORY_PREFIX):], True
    else:
        return None
    try:
        rec = json.loads(body)
    except ValueError:
        return None
    if not isinstance(rec, dict):
        return None
    step = rec.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    tagged = rec.get("attempt")
    if replayed:  # a history line names its own attempt; an untagged one (an older trainer's checkpoint): attempt 0
        attempt = tagged if isinstance(tagged, int) and not isinstance(tagged, bool) and tagged >= 0 else 0
    rewards = rec.get("rewards")
    if not isinstance(rewards, dict):
        rewards = {}
    return Sample(attempt=attempt, step=step, reward=_num(rec.get("reward")),
                  rewards={str(k): _num(v) for k, v in rewards.items()}, kl=_num(rec.get("kl")),
                  completion_length=_num(rec.get("completionLength")), replayed=replayed)


def merge(samples: Iterable[Sample]) -> list[Sample]:
    """One sample per (attempt, step), ordered by attempt then step; a live line wins over a replayed one."""
    best: dict[tuple[int, int], Sample] = {}
    for s in samples:
        key = (s.attempt, s.step)
        if key not in best or (best[key].replayed and not s.replayed):
            best[key] = s
    return [best[k] for k in sorted(best)]


@dataclass(frozen=True)
class Series:
    """One line of a chart: (attempt, step, value) points, non-finite values dropped."""

    name: str
    points: tuple[tuple[int, int, float], ...]


def series(samples: Iterable[Sample], metric: str) -> list[Series]:
    """The lines of one metric: reward → the total reward then one per reward function; kl; completion_length."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: use one of {', '.join(METRICS)}")
    samples = list(samples)

    def line(name: str, get: Any) -> Series:
        pts = tuple((s.attempt, s.step, v) for s in samples if (v := get(s)) is not None)
        return Series(name, pts)

    if metric == "kl":
        return [line("kl", lambda s: s.kl)]
    if metric == "completion_length":
        return [line("completion_length", lambda s: s.completion_length)]
    names: list[str] = []
    for s in samples:
        names += [n for n in s.rewards if n not in names]
    return [line("reward", lambda s: s.reward)] + [line(f"reward/{n}", lambda s, n=n: s.rewards.get(n)) for n in names]


def restarts(samples: Iterable[Sample]) -> list[tuple[int, int]]:
    """(attempt, first step) of every attempt after the first one that has samples: where the chart marks a restart."""
    first: dict[int, int] = {}
    for s in samples:
        first[s.attempt] = min(first.get(s.attempt, s.step), s.step)
    lowest = min(first, default=0)
    return [(a, first[a]) for a in sorted(first) if a != lowest]


@dataclass
class History:
    """What `GRPOClient.get_progress_history` read: the samples, which pod each attempt came from, and notes on what
    could not be read (an attempt whose pods are gone, a pod that has not started)."""

    job: str
    namespace: str
    attempt: int  # the job's current attempt
    samples: list[Sample] = field(default_factory=list)
    sources: dict[int, str] = field(default_factory=dict)  # attempt → pod whose log had its progress lines
    notes: list[str] = field(default_factory=list)

    def as_dict(self, metrics: Iterable[str] = METRICS) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.job, "namespace": self.namespace, "attempt": self.attempt,
                               "sources": {str(k): v for k, v in sorted(self.sources.items())},
                               "restarts": [{"attempt": a, "step": s} for a, s in restarts(self.samples)],
                               "notes": list(self.notes), "series": {}}
        for m in metrics:
            for sr in series(self.samples, m):
                out["series"][sr.name] = [{"attempt": a, "step": s, "value": v} for a, s, v in sr.points]
        return out
