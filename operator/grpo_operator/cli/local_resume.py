"""`grpojob run --local` over an existing output: the spec that wrote it is recorded next to it (RECORD), a run
resumes only when its spec matches that one (fields that do not change what was trained may differ), refuses with
the fields that changed when it does not, and `--fresh` moves the old output aside (never deleting it)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_trainer import resume

from .. import api

RECORD = "grpojob-run.json"  # in the output folder, written when a run starts

# May differ between the run that wrote a checkpoint and the one resuming from it: how long to train on, how often
# to log and save, and where the pods would run (image, template, policies), none of which changes the weights so
# far. Anything else (model, data, rewards, the batch, the optimizer's settings, LoRA…) would silently mix two runs.
RESUMABLE = ("spec.training.maxSteps", "spec.training.numTrainEpochs", "spec.training.saveSteps",
             "spec.training.saveTotalLimit", "spec.training.loggingSteps", "spec.training.reportTo",
             "spec.training.evalSteps", "spec.output", "spec.runPolicy", "spec.template", "spec.image",
             "spec.scheduling", "spec.cache", "spec.hfTokenSecretRef")


@dataclass
class Decision:
    checkpoint: Optional[str]  # the checkpoint the trainer will resume from, None for a fresh start
    refusal: list[str]  # the lines to print when the run must not start (empty: go ahead)


def fingerprint(job: api.GRPOJob, nproc: int) -> dict[str, Any]:
    """What the record keeps: every spec field (defaults included, so writing a default out changes nothing), as
    dotted paths, and the number of local processes (the batch arithmetic depends on it)."""
    flat: dict[str, Any] = {}
    _flatten("spec", job.spec.model_dump(mode="json", by_alias=True), flat)
    flat["processes"] = nproc
    return flat


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def _shown(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value, ensure_ascii=False)


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'field: old → new' for every field that differs and matters (RESUMABLE ones do not)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if any(key == r or key.startswith(r + ".") for r in RESUMABLE):
            continue
        if old.get(key) != new.get(key):
            out.append(f"{key}: {_shown(old.get(key))} → {_shown(new.get(key))}")
    return out


def decide(output_dir: Path, print_name: str, current: dict[str, Any]) -> Decision:
    """Resume, refuse or start: from the output's latest complete checkpoint and the record beside it."""
    checkpoint = resume.latest_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if checkpoint is None:
        return Decision(None, [])
    advice = (f"start over with --fresh (the old output is moved to {print_name}.old-<time>, not deleted), or "
              "choose another --output-dir")
    try:
        recorded = json.loads((output_dir / RECORD).read_text())["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return Decision(checkpoint, [f"{print_name} holds {Path(checkpoint).name} but no record of the spec that "
                                     f"wrote it ({RECORD}), so resuming could mix two runs: {advice}"])
    diff = changes(recorded, current)
    if diff:
        return Decision(checkpoint, [f"{print_name} holds {Path(checkpoint).name} of another spec; changed since:",
                                     *[f"  {d}" for d in diff],
                                     f"Resume with the spec that wrote it, {advice}."])
    return Decision(checkpoint, [])


def write_record(output_dir: Path, current: dict[str, Any]) -> None:
    (output_dir / RECORD).write_text(json.dumps({"fingerprint": current}, indent=1, sort_keys=True))


def move_aside(output_dir: Path) -> Optional[Path]:
    """--fresh: the old output renamed to <out>.old-<UTC time> (a suffix when that exists); None if nothing was there."""
    if not output_dir.exists() or (output_dir.is_dir() and not any(output_dir.iterdir())):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target = output_dir.with_name(f"{output_dir.name}.old-{stamp}")
    n = 1
    while target.exists():
        target = output_dir.with_name(f"{output_dir.name}.old-{stamp}-{n}")
        n += 1
    output_dir.rename(target)
    return target
