"""`kubectl grpo plot NAME`: the job's reward (total and per reward function), KL and completion length over the
training steps of every attempt, drawn in the terminal from the trainer's progress lines (no extra service).

The data: GRPOClient.get_progress_history (rank 0's GRPO_PROGRESS lines, plus the GRPO_HISTORY lines a resumed trainer
re-prints from its checkpoint, since a gang restart deletes the earlier attempts' pods). What could not be read is said
on stderr. -o json|yaml prints the series instead of the charts.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from . import kubectl_out as k

HELP = "draw reward (per reward function), KL and completion length over the steps of every attempt"
CHOICES = ("reward", "kl", "completion_length", "all")


def _positive(text: str) -> int:
    v = k._nonneg_int(text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be ≥ 1")
    return v


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("name")
    c.add_argument("--metric", choices=CHOICES, default="all", help="what to draw (default all: one chart each)")
    c.add_argument("--attempt", type=k._nonneg_int, help="only this attempt (default: every attempt)")
    c.add_argument("--width", type=_positive, help="columns (default: the terminal's width)")
    c.add_argument("--height", type=_positive, default=12, help="rows of each chart (default 12)")
    c.add_argument("--ascii", action="store_true", help="plain ASCII (default when the terminal cannot show Unicode)")


def _unicode_ok(stream: Any) -> bool:
    try:
        "●┤└↻┆".encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def run(client: Any, args: argparse.Namespace) -> int:
    from grpo_operator.client import history, plot

    hist = client.get_progress_history(args.name, attempt=args.attempt)
    metrics = history.METRICS if args.metric == "all" else (args.metric,)
    if args.output:
        k._print(k._dump(hist.as_dict(metrics), args.output))
    elif hist.samples:
        width = args.width or shutil.get_terminal_size((80, 24)).columns
        ascii = args.ascii or not _unicode_ok(sys.stdout)
        marks = history.restarts(hist.samples)
        charts = [plot.chart(f"{m}: {hist.namespace}/{hist.job}", history.series(hist.samples, m), marks,
                             width=width, height=args.height, ascii=ascii) for m in metrics]
        k._print("\n\n".join(charts))
    for note in hist.notes:
        k._err(note)
    if not hist.samples:
        k._err(f"no progress lines in the logs of {hist.namespace}/{hist.job} yet (the trainer prints one per "
               "logging step, spec.training.loggingSteps)")
        return 1
    return 0
