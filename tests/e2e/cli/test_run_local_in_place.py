"""`grpojob run --local` restarts its workers in place after one of them dies (runPolicy.restartPolicy InPlace, the
default): the launcher starts a new generation of workers, which resume from the latest checkpoint, and the run ends
as if nothing happened, saying it restarted. Under Recreate nothing restarts on one machine: the run fails with the
worker's retryable code and running it again resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.processes import alive, descendants, rank_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "examples" / "local-tiny" / "grpojob.yaml"


def _start(tmp: Path, spec: dict[str, Any]) -> subprocess.Popen[str]:
    f = tmp / "job.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen([sys.executable, "-m", "grpo_operator.cli.grpojob", "run", "--local", str(f),
                             "--output-dir", str(tmp / "out"), "--no-progress", "--timeout", "400"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_rank_1_after_first_checkpoint(proc: subprocess.Popen[str], out: Path) -> float:
    """SIGKILL of the rank-1 worker once checkpoint-2 is complete; the time of the kill."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "checkpoint-2" / "trainer_state.json").is_file():
            workers = [p for p in descendants(proc.pid) if rank_of(p) == "1" and alive(p)]
            if workers:
                killed = time.time()
                os.kill(min(workers), signal.SIGKILL)  # the worker itself (its own children, if any, are younger)
                return killed
        time.sleep(0.1)
    raise AssertionError(f"checkpoint-2 never appeared (exit {proc.poll()})")


def _resumed_records(log: str) -> list[dict[str, Any]]:
    """The progress records of the restarted workers: after the checkpoint's history, which a resumed rank 0
    re-prints (GRPO_HISTORY lines) before its first step."""
    lines = log.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("GRPO_HISTORY "))
    return [json.loads(line.split(" ", 1)[1]) for line in lines[first:] if line.startswith("GRPO_PROGRESS ")]


def _spec(policy: str) -> dict[str, Any]:
    spec = yaml.safe_load(JOB.read_text())
    spec["spec"]["training"].update(maxSteps=40, saveSteps=2)
    spec["spec"]["runPolicy"] = {"restartPolicy": policy, "backoffLimit": 2}
    return spec


def test_a_killed_worker_restarts_in_place_and_the_run_succeeds(tmp_path: Path) -> None:
    proc = _start(tmp_path, _spec("InPlace"))
    try:
        killed = _kill_rank_1_after_first_checkpoint(proc, tmp_path / "out")
        _, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    ours = [line for line in stderr.splitlines() if line.startswith("grpojob:")]
    assert proc.returncode == 0, stderr[-3000:]
    assert sum("in-place restart 1: a worker failed" in line for line in ours) == 1, ours
    assert "40/40 steps, resumed from checkpoint-" in ours[-1] and "after 1 in-place restart," in ours[-1], ours[-1]
    resumed = _resumed_records((tmp_path / "out" / "train.log").read_text())
    assert resumed and resumed[0]["timestamp"] > killed and resumed[-1]["step"] == 40
    print(f"run --local in place: SIGKILL of rank 1 -> first resumed step {resumed[0]['timestamp'] - killed:.1f} s "
          f"(step {resumed[0]['step']})")


def test_under_recreate_a_killed_worker_ends_the_run_and_a_rerun_resumes(tmp_path: Path) -> None:
    spec = _spec("Recreate")
    proc = _start(tmp_path, spec)
    try:
        _kill_rank_1_after_first_checkpoint(proc, tmp_path / "out")
        _, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    # retryable: the killed worker's 137, or its peer's 200 (the lost connection) when that one was seen first
    assert proc.returncode in (128 + signal.SIGKILL, 200), stderr[-3000:]
    assert "in-place restart" not in stderr
    again = _start(tmp_path, spec)
    _, stderr = again.communicate(timeout=400)
    ours = [line for line in stderr.splitlines() if line.startswith("grpojob:")]
    assert again.returncode == 0, stderr[-3000:]
    assert "40/40 steps, resumed from checkpoint-" in ours[-1] and "in-place" not in ours[-1], ours[-1]
