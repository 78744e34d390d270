"""`grpojob run --local` over an existing output, with real tiny runs (issue 30 item 4). Before: a second run over
an output whose checkpoint had reached maxSteps trained nothing and said "final reward None", and a changed spec was
silently resumed from the old checkpoint. Now the spec is recorded next to the output: the same spec (or a longer
maxSteps) resumes, another spec is refused with the fields that changed, --fresh moves the old output aside."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "examples" / "local-tiny" / "grpojob.yaml"


def _run(spec: dict[str, Any], tmp: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    f = tmp / "job.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "run", "--local", str(f), "--output-dir",
                           str(out), "--no-progress", "--timeout", "240", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert "Traceback (most recent call last)" not in proc.stderr.split("grpojob:")[-1]
    assert "None" not in _ours(proc.stderr), proc.stderr
    return proc


def _ours(stderr: str) -> str:
    """grpojob's own lines (not the trainer's log, which --no-progress echoes)."""
    return "\n".join(line for line in stderr.splitlines() if line.startswith(("grpojob:", "note:", "  spec.", "Resume"))
                     or ": error: " in line)


def _last(proc: subprocess.CompletedProcess) -> str:
    return [line for line in proc.stderr.splitlines() if line.startswith("grpojob:")][-1]


def test_resume_refuse_and_fresh(tmp_path: Path) -> None:
    spec = yaml.safe_load(JOB.read_text())
    spec["spec"]["training"].update(maxSteps=2, saveSteps=2)
    out = tmp_path / "out"

    first = _run(spec, tmp_path, out)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2/2 steps" in _last(first) and "final reward " in _last(first), _last(first)
    assert (out / "checkpoint-2").is_dir() and (out / "grpojob-run.json").is_file()

    # a longer run of the same spec resumes from the checkpoint and trains the remaining steps
    spec["spec"]["training"]["maxSteps"] = 4
    longer = _run(spec, tmp_path, out)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "resuming from" in longer.stderr and "checkpoint-2" in longer.stderr
    assert "4/4 steps, resumed from checkpoint-2, final reward " in _last(longer), _last(longer)

    # the same spec again: nothing left to train, said in words
    again = _run(spec, tmp_path, out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing left to train: checkpoint-4 had already reached maxSteps 4" in _last(again), _last(again)

    # another spec: refused before anything starts, with each changed field
    spec["spec"]["training"]["learningRate"] = 2.0e-4
    spec["spec"]["rewards"] = [{"name": "accuracy"}]
    refused = _run(spec, tmp_path, out)
    assert refused.returncode == 1
    assert "holds checkpoint-4 of another spec; changed since:" in refused.stderr, refused.stderr
    assert "  spec.training.learningRate: 0.0001 → 0.0002" in refused.stderr.splitlines()
    assert any(line.startswith("  spec.rewards: ") for line in refused.stderr.splitlines()), refused.stderr
    assert "--fresh" in refused.stderr and "torchrun" not in refused.stderr

    # --fresh: the old output moved aside (kept), a new run from step 0
    spec["spec"]["training"]["maxSteps"] = 2
    fresh = _run(spec, tmp_path, out, "--fresh")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("out.old-")]
    assert (old / "checkpoint-4").is_dir() and "--fresh: the previous output is now" in fresh.stderr
    assert "resuming" not in fresh.stderr and "2/2 steps, final reward " in _last(fresh), _last(fresh)
    assert (out / "checkpoint-2").is_dir() and not (out / "checkpoint-4").exists()
