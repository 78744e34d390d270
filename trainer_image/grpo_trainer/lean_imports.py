"""Keeps the optional packages a job does not use out of the trainer process: TRL's trainer module imports vLLM,
wandb and trackio whenever they are installed, which was about 8 of the 19 CPU-seconds of `from trl import
GRPOTrainer` here (the images ship all three), paid again by every process on every start and restart."""

from __future__ import annotations

import sys
from collections.abc import Iterable

TRACKERS = ("wandb", "trackio")  # the report_to integrations TRL's trainer module imports at import time


def unused(use_vllm: bool, report_to: Iterable[str] | None) -> tuple[str, ...]:
    """The optional top-level packages this job will not call: vLLM without vllm.mode colocate/server, and every
    tracker its report_to does not name (transformers has already expanded "all" into the installed ones)."""
    reported = set(report_to or ())
    return (() if use_vllm else ("vllm",)) + tuple(t for t in TRACKERS if t not in reported)


def hide(names: Iterable[str]) -> list[str]:
    """Makes each package not importable in this process, before TRL is imported: `sys.modules[name] = None` is how
    Python spells "not installed" (importlib.util.find_spec returns None, import raises ImportError), so TRL's own
    availability checks skip it. For the life of the process, on purpose: TRL's later checks (model cards at each
    checkpoint, profiling) would otherwise see the package again and reach a module global it never imported.
    A package already imported (a reward function that uses it) stays. Returns the names hidden."""
    hidden = [n for n in names if n not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    return hidden
