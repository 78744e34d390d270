"""Live training progress (pure): trainer metrics text → status.progress, the rank-0 pod, and when to write.

The trainer's local rank 0 on every node serves Prometheus metrics (grpo_trainer/metrics.py); exactly one of them
is global rank 0 (`grpo_trainer_global_rank0 1`) and carries the training gauges. controller/scraper.py fetches the
text (I/O) and calls these functions; nothing here does I/O or imports kopf/kubernetes. docs/observability.md.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from grpo_trainer import contract

# trainer gauge → status.progress field
GAUGES = {
    "grpo_trainer_step": "step",
    "grpo_trainer_max_steps": "maxSteps",
    "grpo_trainer_reward_mean": "reward",
    "grpo_trainer_reward_std": "rewardStd",
    "grpo_trainer_kl": "kl",
    "grpo_trainer_completion_length_mean": "completionLength",
    "grpo_trainer_learning_rate": "learningRate",
    "grpo_trainer_tokens_per_second": "tokensPerSecond",
    "grpo_trainer_eta_seconds": "etaSeconds",
    # which attempt the trainer belongs to and its in-place restarts in it (lifecycle/inplace.py counts them)
    "grpo_trainer_attempt": "attempt",
    "grpo_trainer_in_place_restarts": "inPlaceRestarts",
}
RANK0 = "grpo_trainer_global_rank0"
LAST_LOG = "grpo_trainer_last_log_timestamp_seconds"
REWARD_FUNCTION = "grpo_trainer_reward_function_mean"
INTEGER_FIELDS = ("step", "maxSteps", "attempt", "inPlaceRestarts")
RESTART_FIELDS = ("attempt", "inPlaceRestarts")  # known from the start, not only after a logging step
# Fields that only a logging step sets (before the first one after a (re)start, the previous values stay).
LOGGED_FIELDS = ("reward", "rewardStd", "rewards", "kl", "completionLength", "learningRate", "tokensPerSecond",
                 "etaSeconds", "updateTime")
SIGNIFICANT_DIGITS = 6  # status values are rounded: "0.265625", not "0.26562500000000004"


class MetricsParseError(ValueError):
    pass


@dataclass(frozen=True)
class RankSample:
    """One training process as its node's endpoint shows it (grpo_trainer/phases.py): phase, when it entered it
    (trainer's unix time), its last heartbeat and its step."""

    rank: int
    phase: Optional[str] = None
    since: Optional[float] = None
    heartbeat: Optional[float] = None
    step: Optional[int] = None
    download_bytes: Optional[float] = None  # while loading: the bytes in its Hub cache (a download grows them)
    began_step: Optional[int] = None  # the step it began training at: a step past it is one this process trained


RANK_PHASE, RANK_SINCE = "grpo_trainer_rank_phase", "grpo_trainer_rank_phase_since_timestamp_seconds"
RANK_BEAT, RANK_STEP = "grpo_trainer_rank_heartbeat_timestamp_seconds", "grpo_trainer_rank_step"


@dataclass(frozen=True)
class Scrape:
    """What one trainer pod's /metrics said."""

    pod: str
    global_rank0: Optional[bool]  # None: the gauge is missing (not a grpo trainer, or an old image)
    values: dict[str, float] = field(default_factory=dict)  # progress field → finite value
    rewards: dict[str, float] = field(default_factory=dict)  # reward function → finite mean
    last_log: Optional[float] = None  # unix time of the last logging step
    ranks: tuple[RankSample, ...] = ()  # every process of the pod (an older image: none)


def _finite(v: Any) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def parse_metrics(text: str, pod: str = "") -> Scrape:
    """Prometheus text exposition → Scrape. NaN/Inf samples count as missing. Raises MetricsParseError."""
    from prometheus_client.parser import text_string_to_metric_families

    rank0: Optional[bool] = None
    values: dict[str, float] = {}
    rewards: dict[str, float] = {}
    last_log: Optional[float] = None
    ranks: dict[int, dict[str, Any]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:
        raise MetricsParseError(f"not Prometheus text: {type(exc).__name__}: {exc}") from None
    for fam in families:
        for s in fam.samples:
            v = _finite(s.value)
            if s.name == RANK0:
                rank0 = v is not None and v >= 1
            elif s.name == LAST_LOG:
                last_log = v
            elif s.name == REWARD_FUNCTION:
                label = s.labels.get("reward")
                if label and v is not None:
                    rewards[label] = v
            elif s.name in GAUGES and v is not None:
                values[GAUGES[s.name]] = v
            elif s.name in _RANK_FIELDS and s.labels.get("rank", "").isdigit() and v is not None:
                _rank_sample(ranks.setdefault(int(s.labels["rank"]), {}), s.name, s.labels, v)
    return Scrape(pod=pod, global_rank0=rank0, values=values, rewards=rewards, last_log=last_log,
                  ranks=tuple(RankSample(r, **f) for r, f in sorted(ranks.items())))


_RANK_FIELDS = {RANK_PHASE: "phase", RANK_SINCE: "since", RANK_BEAT: "heartbeat", RANK_STEP: "step",
                contract.RANK_DOWNLOAD_BYTES: "download_bytes", contract.RANK_BEGAN_STEP: "began_step"}


def _rank_sample(fields: dict[str, Any], name: str, labels: Mapping[str, str], v: float) -> None:
    if name == RANK_PHASE:
        if v >= 1:
            fields["phase"] = labels.get("phase")
    elif name in (RANK_STEP, contract.RANK_BEGAN_STEP):
        fields[_RANK_FIELDS[name]] = int(v)
    else:
        fields[_RANK_FIELDS[name]] = v


def choose_rank0(scrapes: Iterable[Scrape]) -> Optional[Scrape]:
    """The scrape of the global-rank-0 process. c10d assigns ranks by arrival, so it may be on any node.

    Several claimants (a stale pod still answering during a restart) → the one that logged last. No claimant but
    exactly one pod with a step → that one (an image without the rank gauge)."""
    scrapes = list(scrapes)
    claim = [s for s in scrapes if s.global_rank0]
    if claim:
        return max(claim, key=lambda s: (s.last_log or 0.0, s.values.get("step", -1.0)))
    if any(s.global_rank0 is False for s in scrapes):
        candidates = [s for s in scrapes if s.global_rank0 is None and "step" in s.values]
    else:
        candidates = [s for s in scrapes if "step" in s.values]
    return candidates[0] if len(candidates) == 1 else None


def _round(v: float) -> float:
    if v == 0:
        return 0.0
    return float(f"{v:.{SIGNIFICANT_DIGITS}g}")


def fmt_time(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_progress(scrape: Scrape, previous: Optional[Mapping[str, Any]] = None) -> Optional[dict[str, Any]]:
    """status.progress from the rank-0 scrape; None when it knows no step yet (still loading the model).

    Before its first logging step a (re)started trainer knows its step (the checkpoint's) but no reward: the
    previous progress's logged fields are kept, so a gang restart does not blank the REWARD column."""
    vals = scrape.values
    if "step" not in vals:
        return None
    out: dict[str, Any] = {}
    if scrape.last_log is None and previous:
        out.update({k: previous[k] for k in LOGGED_FIELDS if previous.get(k) is not None})
    else:
        for f in GAUGES.values():
            if f in vals and f not in INTEGER_FIELDS:
                out[f] = _round(vals[f])
        if scrape.rewards:
            out["rewards"] = {k: _round(v) for k, v in sorted(scrape.rewards.items())}
        if scrape.last_log is not None:
            out["updateTime"] = fmt_time(scrape.last_log)
    step = int(vals["step"])
    out["step"] = step
    max_steps = int(vals["maxSteps"]) if vals.get("maxSteps", 0) > 0 else None
    if max_steps is not None:
        out["maxSteps"] = max_steps
    out["display"] = f"{step}/{max_steps}" if max_steps is not None else str(step)
    out.update({f: int(vals[f]) for f in RESTART_FIELDS if f in vals})
    if "etaSeconds" in out:
        out["etaSeconds"] = round(out["etaSeconds"])
    return dict(sorted(out.items()))


RESULT_PREFIX = contract.RESULT_PREFIX  # the trainer's final record in its pod's termination message


def from_result_message(message: Optional[str], previous: Optional[Mapping[str, Any]] = None,
                        now: Optional[float] = None) -> Optional[dict[str, Any]]:
    """status.progress from a finished rank-0 pod's termination message (`GRPO_RESULT {json}`), else None.

    The last scrape can lag the end by up to one interval; this record is where training really finished."""
    import json

    if not message or not message.startswith(RESULT_PREFIX):
        return None
    try:
        rec = json.loads(message[len(RESULT_PREFIX):].strip())
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec.get("step"), bool):
        return None
    out: dict[str, Any] = {k: v for k, v in (previous or {}).items() if k not in ("display", "etaSeconds")}
    for k in LOGGED_FIELDS:
        v = rec.get(k)
        if k == "rewards" and isinstance(v, dict):
            out[k] = {str(n): _round(x) for n, x in sorted(v.items()) if _finite(x) is not None}
        elif (x := _finite(v)) is not None:
            out[k] = _round(x)
    out["step"] = rec["step"]
    max_steps = rec.get("maxSteps")
    if isinstance(max_steps, int) and max_steps > 0:
        out["maxSteps"] = max_steps
    out["display"] = f"{out['step']}/{out['maxSteps']}" if out.get("maxSteps") else str(out["step"])
    out["etaSeconds"] = 0
    if now is not None:
        out["updateTime"] = fmt_time(now)
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------------------------ whom to scrape
@dataclass(frozen=True)
class Endpoint:
    """A pod's metrics address (from the pod: status.podIP and its container port named `metrics`): a trainer's
    /metrics, or spec.cache's download pod's /progress (role `initializer`)."""

    pod: str
    ip: Optional[str]
    port: Optional[int]
    attempt: int = 0
    running: bool = False
    role: str = contract.ROLE_TRAINER

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if self.ip and ":" in self.ip else self.ip
        path = contract.STAGE_PROGRESS_PATH if self.role == contract.ROLE_INITIALIZER else "/metrics"
        return f"http://{host}:{self.port}{path}"


def endpoints_to_scrape(endpoints: Iterable[Endpoint], attempt: int, rank0_pod: Optional[str]) -> list[Endpoint]:
    """The running trainer pods of the current attempt that have an IP and a metrics port; only the known rank-0
    pod while it is still among them (one request per job per interval instead of one per node)."""
    live = sorted((e for e in endpoints if e.running and e.ip and e.port and e.attempt == attempt
                   and e.role == contract.ROLE_TRAINER), key=lambda e: e.pod)
    known = [e for e in live if e.pod == rank0_pod]
    return known or live


def stage_endpoint(endpoints: Iterable[Endpoint]) -> Optional[Endpoint]:
    """spec.cache's download pod while it runs (with an IP and a port): where its live progress is; else None."""
    return next((e for e in endpoints if e.role == contract.ROLE_INITIALIZER and e.running and e.ip and e.port), None)


# ------------------------------------------------------------------------------------------ when to write
@dataclass(frozen=True)
class WriteDecision:
    include: bool  # put the new progress into this status write
    retry_after: Optional[float] = None  # seconds until a progress-only write is allowed again


def decide_write(current: Optional[Mapping[str, Any]], latest: Optional[Mapping[str, Any]], *, writing_anyway: bool,
                 last_write: Optional[float], now: float, interval: float) -> WriteDecision:
    """Whether the latest scraped progress goes into the status now.

    Only a change is written. A status write that happens anyway (phase, conditions) carries it for free; a write
    for progress alone happens at most once per `interval` seconds per job (`last_write`: monotonic time of the
    previous write that carried progress; None: none since this operator started)."""
    if latest is None or dict(latest) == dict(current or {}):
        return WriteDecision(False)
    if writing_anyway or last_write is None or now - last_write >= interval:
        return WriteDecision(True)
    return WriteDecision(False, retry_after=max(last_write + interval - now, 0.0))


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns `old` into `new` (keys that disappear become null)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: dict[str, Any] = {}
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            patch[k] = merge_patch(old[k], v)
    for k in old:
        if k not in new:
            patch[k] = None
    return patch


def fix_progress_patch(patch: Optional[dict[str, Any]], old_status: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """lifecycle.status_patch sends a changed `progress` whole; as a merge patch that would keep reward functions
    or fields the trainer no longer reports. Replace it by the exact nested merge patch."""
    if not patch or not isinstance(patch.get("progress"), Mapping) or not isinstance(old_status.get("progress"), Mapping):
        return patch
    patch = dict(patch)
    patch["progress"] = merge_patch(old_status["progress"], patch["progress"])
    return patch


def summary(progress: Optional[Mapping[str, Any]]) -> str:
    """A one-line summary (logs)."""
    if not progress:
        return "no progress"
    parts = [f"step {progress.get('display')}"]
    if progress.get("reward") is not None:
        parts.append(f"reward {progress['reward']}")
    if progress.get("etaSeconds") is not None:
        parts.append(f"eta {progress['etaSeconds']}s")
    return ", ".join(parts)
