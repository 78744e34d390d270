"""Finds the latest COMPLETE checkpoint (checkpoint-N with a valid trainer_state.json and weights) to resume from."""

from __future__ import annotations

import json
import os
import re

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
            "adapter_model.safetensors", "adapter_model.bin")


def is_complete(path: str, step: int | None = None) -> bool:
    """A checkpoint is complete when the Trainer wrote its last file, trainer_state.json, and the weights exist.

    transformers writes the model, then optimizer/scheduler/RNG, then trainer_state.json; a checkpoint cut short
    by a kill lacks the state file (or holds a truncated one, which does not parse).
    """
    try:
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(state, dict) or (step is not None and state.get("global_step") != step):
        return False
    return any(os.path.exists(os.path.join(path, w)) for w in _WEIGHTS)


def latest_checkpoint(output_dir: str) -> str | None:
    """The path of the highest-step complete checkpoint-N in output_dir, or None (fresh start)."""
    try:
        names = os.listdir(output_dir)
    except OSError:
        return None
    steps = sorted(((int(m.group(1)), n) for n in names if (m := _CHECKPOINT.match(n))), reverse=True)
    for step, name in steps:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path) and is_complete(path, step):
            return path
    return None


def step_of(checkpoint: str) -> int:
    """N of a checkpoint-N path."""
    m = _CHECKPOINT.match(os.path.basename(os.path.normpath(checkpoint)))
    return int(m.group(1)) if m else 0
