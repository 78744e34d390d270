"""SIGTERM before torchrun starts the workers (waiting for the c10d store, in rendezvous) exits 143 at once.

The launcher is the container's PID 1 and the kernel ignores a signal PID 1 has no handler for: without its own
handler a pod deleted while it waited for its peers stayed for the whole 120 s termination grace period (issue 22,
item 6). Outside a container the default action kills the process instead (exit -15): the test tells them apart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(120)
def test_sigterm_while_waiting_for_the_rendezvous_store_exits_143_at_once() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'trainer_image'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-m", "grpo_trainer.launch", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            "--rdzv-endpoint=grpo-peer-that-never-comes.invalid:29400", "--rdzv-conf=join_timeout=600",
            "-m", "grpo_trainer", "--config", "/nonexistent/config.json"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    waiting = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "waiting for the rendezvous store" in line:
                waiting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert waiting.wait(90), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    assert code == 143, (code, "".join(lines))
    assert any("SIGTERM before the workers started" in line for line in lines), "".join(lines)
