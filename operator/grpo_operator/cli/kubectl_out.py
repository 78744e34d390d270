"""Output and flag helpers shared by the `kubectl grpo` verbs (kubectl_grpo.py, kubectl_submit.py, kubectl_plot.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be ≥ 0")
    return v


def _dump(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, default=str)
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip()


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _show(job: Any, output: Optional[str], done: str) -> None:
    _print(_dump(job.as_dict(), output) if output else f"grpojob.grpo.dev/{job.name} {done}")


def _err(text: str) -> None:
    sys.stderr.write(f"kubectl-grpo: {text}\n")
    sys.stderr.flush()
