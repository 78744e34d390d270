"""Where a trainer process's start went, from the moment the process began to the end of its first step: the
interpreter and torch's import, the job's preparation (tokenizer, data set, rewards, TRL's config), TRL's import, the
model and trainer, the checkpoint restore, and the first step. Global rank 0 prints it once, as a sentence and as a
`GRPO_STARTUP {json}` line (contract.STARTUP_PREFIX) that bench/journey_bench.py reads: a slow start, and what an
in-place restart or a recreated gang pays again, can be told apart from the pod's log alone."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Optional

from .contract import IN_PLACE_RESTARTS_ENV, STARTUP_PREFIX

# the marks, in order; each phase's seconds run from the mark before it (the first from the process's start)
PHASES = ("imports", "prepare", "trl", "model", "restore", "firstStep")
WORDS = {"imports": "interpreter and torch", "prepare": "data, rewards and config", "trl": "TRL import",
         "model": "model and trainer", "restore": "checkpoint restore", "firstStep": "first step"}


def process_start() -> Optional[float]:
    """This process's start as epoch seconds (Linux: /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class StartClock:
    """The marks of one process's start (each kept at its first time: a mark is never moved by a later call)."""

    def __init__(self, began: Optional[float] = None, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.began = began if began is not None else process_start()
        self.marks: dict[str, float] = {}
        self.reported = False

    def mark(self, phase: str) -> None:
        self.marks.setdefault(phase, self.clock())

    def record(self) -> dict[str, Any]:
        """{processStart, <phase>: seconds, ..., total, inPlaceRestart}: the phases marked so far."""
        rec: dict[str, Any] = {"processStart": round(self.began, 3) if self.began is not None else None}
        last = self.began
        for phase in PHASES:
            at = self.marks.get(phase)
            if at is None:
                continue
            rec[phase] = round(at - last, 3) if last is not None else None
            last = at
        end = self.marks.get("firstStep")
        rec["total"] = round(end - self.began, 3) if end is not None and self.began is not None else None
        restarts = os.environ.get(IN_PLACE_RESTARTS_ENV, "")
        rec["inPlaceRestart"] = int(restarts) if restarts.isdigit() else 0
        return rec


def sentence(rec: dict[str, Any]) -> str:
    parts = [f"{WORDS[p]} {rec[p]:.1f} s" for p in PHASES if isinstance(rec.get(p), (int, float))]
    total = rec.get("total")
    head = f"first step {total:.1f} s after the process started" if isinstance(total, (int, float)) else "start-up"
    return f"{head}: {', '.join(parts)}"


def report(clock: StartClock, stream=None) -> None:
    """Once, on global rank 0: the sentence on stderr, the record on stdout."""
    if clock.reported or int(os.environ.get("RANK", "0")) != 0:
        return
    clock.reported = True
    rec = clock.record()
    sys.stderr.write(f"grpo_trainer: {sentence(rec)}\n")
    sys.stderr.flush()
    out = stream or sys.stdout
    out.write(STARTUP_PREFIX + json.dumps(rec, sort_keys=True) + "\n")
    out.flush()


def callback(clock: StartClock) -> Any:
    """The TrainerCallback that marks the restore (training begins once the checkpoint is loaded) and the first step."""
    from transformers import TrainerCallback

    class StartCallback(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.mark("restore")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if "firstStep" not in clock.marks:
                clock.mark("firstStep")
                report(clock)

    return StartCallback()
