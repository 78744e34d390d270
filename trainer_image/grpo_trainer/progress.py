"""A TrainerCallback that prints `GRPO_PROGRESS {json}` lines (global rank 0 only) for the CLI's progress bar."""

from __future__ import annotations

import json
import sys
import time

from transformers import TrainerCallback

PREFIX = "GRPO_PROGRESS "
RESULT_PREFIX = "GRPO_RESULT "

# progress field -> TRL log key
_FIELDS = {"reward": "reward", "rewardStd": "reward_std", "kl": "kl", "completionLength": "completions/mean_length",
           "learningRate": "learning_rate", "loss": "loss", "epoch": "epoch"}


def _number(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def emit(prefix: str, record: dict, stream=None) -> None:
    stream = stream or sys.stdout
    stream.write(prefix + json.dumps(record, separators=(",", ":")) + "\n")
    stream.flush()


class ProgressCallback(TrainerCallback):
    """On every log event, one JSON line {step, maxSteps, reward, rewardStd, kl, completionLength, learningRate,
    loss, epoch, elapsed}; fields TRL did not log are null."""

    def __init__(self, stream=None):
        self.stream = stream
        self.start = time.monotonic()
        self.last: dict = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "reward" not in logs and "loss" not in logs:
            return  # the final train summary (train_runtime, ...) is not a step
        record = {"step": state.global_step, "maxSteps": state.max_steps}
        record.update({field: _number(logs.get(key)) for field, key in _FIELDS.items()})
        record["elapsed"] = round(time.monotonic() - self.start, 3)
        self.last = record
        if state.is_world_process_zero:
            emit(PREFIX, record, self.stream)
