"""A TrainerCallback that reports progress at every logging step (global rank 0 only): `GRPO_PROGRESS {json}` lines
on stdout (for `grpojob run --local`'s progress bar) and the Prometheus gauges of metrics.py (for the operator's
status.progress and for Prometheus). Both come from the same record."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from typing import Any

from transformers import TrainerCallback

from .contract import ATTEMPT_ENV, HISTORY_PREFIX, RESULT_PREFIX
from .contract import PROGRESS_PREFIX as PREFIX
from .metrics import finite

# progress field -> TRL log key
_FIELDS = {"reward": "reward", "rewardStd": "reward_std", "kl": "kl", "completionLength": "completions/mean_length",
           "learningRate": "learning_rate", "loss": "loss", "epoch": "epoch"}
RATE_WINDOW = 8  # logging steps over which tokens/s and the ETA are averaged
ATTEMPT_KEY = "grpo_attempt"  # stamped on each trainer_state.json log_history entry: which attempt logged the step


def emit(prefix: str, record: dict, stream=None) -> None:
    stream = stream or sys.stdout
    stream.write(prefix + json.dumps(record, separators=(",", ":")) + "\n")
    stream.flush()


def reward_stats(logs: dict, stat: str = "mean") -> dict:
    """TRL's per-function logs `rewards/<name>/<stat>` → {name: value} (non-finite values → None)."""
    out = {}
    for key, value in logs.items():
        if key.startswith("rewards/") and key.endswith("/" + stat):
            out[key[len("rewards/"):-len(stat) - 1]] = finite(value)
    return out


class ProgressCallback(TrainerCallback):
    """On every log event, one record {step, maxSteps, reward, rewardStd, rewards, kl, completionLength,
    learningRate, loss, epoch, tokensPerSecond, etaSeconds, elapsed, timestamp}; fields TRL did not log are null.

    `print_lines`: write GRPO_PROGRESS lines to stdout; `metrics`: a metrics.TrainerMetrics to update (either may be
    off). tokens/s and the ETA come from the last RATE_WINDOW logging steps of *this* process, so after a resume from
    a checkpoint they reflect the current speed, not the steps the checkpoint already had."""

    def __init__(self, stream=None, *, print_lines: bool = True, metrics=None):
        self.stream = stream
        self.print_lines = print_lines
        self.metrics = metrics
        self.start = time.monotonic()
        self.last: dict = {}
        self.window: deque = deque(maxlen=RATE_WINDOW + 1)  # (monotonic time, step, tokens seen)

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()
        self.window.clear()
        self.window.append((self.start, state.global_step, finite(getattr(state, "num_input_tokens_seen", None))))
        if self.metrics is not None and state.is_world_process_zero:
            self.metrics.begin(state.global_step, state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "reward" not in logs and "loss" not in logs:
            return  # the final train summary (train_runtime, ...) is not a step
        now = time.monotonic()
        record = {"step": state.global_step, "maxSteps": state.max_steps}
        record.update({field: finite(logs.get(key)) for field, key in _FIELDS.items()})
        record["rewards"] = reward_stats(logs, "mean")
        record["rewardStds"] = reward_stats(logs, "std")
        tokens = finite(logs.get("num_tokens"))
        if tokens is None:
            tokens = finite(getattr(state, "num_input_tokens_seen", None))
        self.window.append((now, state.global_step, tokens))
        t0, s0, k0 = self.window[0]
        dt = now - t0
        record["tokensPerSecond"] = round((tokens - k0) / dt, 3) if tokens is not None and k0 is not None and dt > 0 \
            and tokens >= k0 else None
        steps = state.global_step - s0
        left = state.max_steps - state.global_step if state.max_steps and state.max_steps > 0 else None
        record["etaSeconds"] = round(dt / steps * left, 1) if steps > 0 and left is not None and left >= 0 else None
        record["elapsed"] = round(now - self.start, 3)
        record["timestamp"] = round(time.time(), 3)
        self.last = record
        _stamp_attempt(state)
        if state.is_world_process_zero:
            if self.print_lines:
                emit(PREFIX, record, self.stream)
            if self.metrics is not None:
                self.metrics.update(record)


def _attempt() -> int | None:
    value = os.environ.get(ATTEMPT_ENV, "")
    return int(value) if value.isdigit() else None


def _stamp_attempt(state) -> None:
    """The attempt that logged this step goes into its log_history entry, and so into the next checkpoint's
    trainer_state.json, from which a resumed trainer re-prints it (replay_history): the pods of earlier attempts are
    deleted at a gang restart, their logs with them."""
    attempt = _attempt()
    history = getattr(state, "log_history", None)
    if attempt is not None and history and isinstance(history[-1], dict) and history[-1].get("step") == state.global_step:
        history[-1].setdefault(ATTEMPT_KEY, attempt)


def history_records(log_history: list) -> list[dict]:
    """trainer_state.json's log_history → the progress records of the logged steps (as ProgressCallback writes them,
    without the rates), each with the attempt that logged it when known."""
    out = []
    for entry in log_history:
        if not isinstance(entry, dict) or ("reward" not in entry and "loss" not in entry):
            continue
        step = entry.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        record: dict[str, Any] = {"step": step, **{field: finite(entry.get(key)) for field, key in _FIELDS.items()}}
        record["rewards"] = reward_stats(entry, "mean")
        if isinstance(entry.get(ATTEMPT_KEY), int):
            record["attempt"] = entry[ATTEMPT_KEY]
        out.append(record)
    return out


def replay_history(checkpoint: str, stream=None) -> int:
    """Print the checkpoint's logged steps as `GRPO_HISTORY {json}` lines (global rank 0, on resume), so that the log of
    the current attempt holds the history `kubectl grpo plot` draws. Returns how many; 0 if the file is unreadable."""
    try:
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
            history = json.load(f).get("log_history") or []
    except (OSError, ValueError, AttributeError):
        return 0
    records = history_records(history if isinstance(history, list) else [])
    for record in records:
        emit(HISTORY_PREFIX, record, stream)
    return len(records)


# Kept under the 1024 characters the operator reads from a pod's termination message.
FINAL_FIELDS = ("reward", "rewardStd", "kl", "completionLength", "learningRate", "tokensPerSecond")


def final_record(last: dict[str, Any], step: int, max_steps: int) -> dict[str, Any]:
    record: dict[str, Any] = {"step": step, "maxSteps": max_steps}
    record.update({k: last[k] for k in FINAL_FIELDS if last.get(k) is not None})
    rewards = last.get("rewards")
    if isinstance(rewards, dict) and len(json.dumps(rewards)) < 600:
        record["rewards"] = rewards
    return record


def write_final_progress(last: dict, step: int, max_steps: int) -> None:
    """`GRPO_RESULT {json}` into /dev/termination-log (GRPO_TERMINATION_LOG), where the operator reads it."""
    import os

    path = os.environ.get("GRPO_TERMINATION_LOG", "/dev/termination-log")
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(RESULT_PREFIX + json.dumps(final_record(last, step, max_steps), separators=(",", ":")) + "\n")
    except OSError:
        pass
