"""`grpojob run --local` stopped by Ctrl-C or SIGTERM leaves no process behind. torchrun starts each worker in a
session of its own, so stopping the launcher's process group left the workers training (seen on this machine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import alive as _alive
from tests.support.processes import descendants as _tree

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "examples" / "local-tiny" / "grpojob.yaml"


@pytest.mark.parametrize("how, code", [("SIGINT", 130), ("SIGTERM", 130), ("SIGKILL launcher group", None)])
def test_stopping_run_local_stops_every_worker(tmp_path: Path, how: str, code: int | None) -> None:
    """Ctrl-C (SIGINT) and SIGTERM of grpojob; and the launcher's process group SIGKILLed (an OOM kill of torchrun):
    its workers, in sessions of their own, must not train on."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    grpojob = Path(sys.executable).parent / "grpojob"
    # As from a terminal: SIGINT at its default. A test run started in the background by a script inherits SIGINT
    # ignored (bash does that to asynchronous commands), and Python then installs no Ctrl-C handler at all.
    proc = subprocess.Popen([str(grpojob), "run", "--local", str(JOB), "--output-dir", str(tmp_path / "out"),
                             "--no-progress"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        workers: dict[int, str] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            tree = _tree(proc.pid)
            workers = {p: c for p, c in tree.items() if "-m grpo_trainer --config" in c or "grpo_trainer" in c
                       and "grpo_trainer.launch" not in c}
            if len(workers) >= 2:  # the job's 2 processes are running
                break
            time.sleep(0.2)
        assert len(workers) >= 2, f"workers never started: {proc.stdout.read() if proc.poll() is not None else ''}"
        everything = _tree(proc.pid)
        if how == "SIGKILL launcher group":
            launcher = next(p for p, c in everything.items() if "grpo_trainer.launch" in c)
            os.killpg(launcher, signal.SIGKILL)
        else:
            proc.send_signal(getattr(signal, how))
        proc.wait(timeout=90)
        if code is not None:
            assert proc.returncode == code
        else:
            assert proc.returncode != 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in everything):
            time.sleep(0.1)
        left = {p: c for p, c in everything.items() if _alive(p)}
        assert not left, f"still running after grpojob exited: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in [*_tree(proc.pid), *locals().get("everything", {})]:  # orphans too (re-parented to init)
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
