"""What the vLLM e2e tests add to tests.support.trainer: an environment that keeps vLLM's files in the test's own
folder, TRL's per-step log records, and a long-running server process with its output in a file.

Every vLLM process a test starts gets its own TMPDIR/VLLM_CACHE_ROOT/VLLM_RPC_BASE_PATH (two vLLM processes sharing
them collide on their IPC sockets and caches), so nothing is left in /tmp or ~/.cache, and VLLM_CPU_KVCACHE_SPACE=1
(GiB) unless the test wants the trainer's own default: the tests never take more memory than the tiny model needs.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
from pathlib import Path

from tests.support.trainer import REPO, env


def vllm_env(tmp: Path, *, kv_cache: bool = True, **extra) -> dict[str, str]:
    """Extra environment for a process that runs vLLM: its files under `tmp`, 1 GiB of KV cache per engine."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = {"TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "VLLM_RPC_BASE_PATH": str(tmp),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "PYTHONUNBUFFERED": "1"}
    if kv_cache:
        out["VLLM_CPU_KVCACHE_SPACE"] = "1"
    out.update({k: str(v) for k, v in extra.items()})
    return out


def trl_logs(text: str) -> list[dict]:
    """TRL's per-step log records (transformers prints them as Python dict literals), training steps only."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{'loss'"):
            out.append({k: float(v) for k, v in ast.literal_eval(line).items()})
    return out


def start_logged(cmd: list[str], log: Path, **extra_env) -> subprocess.Popen:
    """A server in its own process group, output to `log` (a pipe nobody reads would fill and block it)."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=REPO, env=env(**extra_env), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(proc: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM the process group of `proc` (vLLM's engine runs in a child), SIGKILL what is left after `grace` s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # children that outlived the parent
    except ProcessLookupError:
        pass
    proc.wait()
