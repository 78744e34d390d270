"""Helpers of the vLLM and trainer e2e tests: the tiny example's trainer config, processes run under a timeout in
their own process group (stopped by PID), free loopback ports, and TRL's per-step log records.

Every vLLM process a test starts gets its own TMPDIR/VLLM_CACHE_ROOT/VLLM_RPC_BASE_PATH (notes/vllm-cpu.md, pitfall 6),
so nothing is left in /tmp or ~/.cache, and VLLM_CPU_KVCACHE_SPACE=1 (GiB): the tests never take more memory
than the tiny model needs.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "local-tiny"
TINY_MODEL = TINY / "model"
TINY_DATA = TINY / "data" / "arithmetic.jsonl"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
RESULT = "GRPO_RESULT "
PROGRESS = "GRPO_PROGRESS "


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def trainer_config(output_dir, *, vllm: dict | None = None, **training) -> dict:
    """A trainer config document as the operator renders it (docs/trainer-config.md) for the tiny example."""
    base = {"per_device_train_batch_size": 2, "num_generations": 2, "gradient_accumulation_steps": 1,
            "max_steps": 4, "max_completion_length": 8, "logging_steps": 1, "save_steps": 2,
            "learning_rate": 1e-4, "report_to": "none", "seed": 0}
    base.update(training)
    return {
        "schemaVersion": 1,
        "job": {"name": "test", "namespace": "default", "uid": ""},
        "model": str(TINY_MODEL),
        "dataset": {"name": str(TINY_DATA), "config": None, "split": "train", "promptColumn": "question",
                    "answerColumn": "answer"},
        "rewards": [{"name": "accuracy", "function": None, "weight": 1.0},
                    {"name": "length", "function": None, "weight": 0.5}],
        "training": {k: v for k, v in base.items() if v is not None},
        "vllm": {"mode": "none", "tensorParallelSize": 1, "gpuMemoryUtilization": 0.3, "serverHost": None,
                 "serverPort": 8000, **(vllm or {})},
        "outputDir": str(output_dir),
        "progress": {"enabled": True},
    }


def write_json(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def env(tmp: Path, **extra) -> dict:
    """The test process environment: offline, vLLM's files under `tmp`, 1 GiB of KV cache per engine."""
    tmp.mkdir(parents=True, exist_ok=True)
    e = dict(os.environ)
    e.update(OFFLINE)
    e.update({"TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "VLLM_RPC_BASE_PATH": str(tmp),
              "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "VLLM_CPU_KVCACHE_SPACE": "1",
              "GRPO_TERMINATION_LOG": os.devnull, "PYTHONUNBUFFERED": "1"})
    e.update({k: str(v) for k, v in extra.items()})
    return e


class Run:
    def __init__(self, returncode: int, stdout: str, stderr: str, wall: float):
        self.returncode, self.stdout, self.stderr, self.wall = returncode, stdout, stderr, wall

    def logs(self) -> list[dict]:
        """TRL's per-step log dicts (printed by transformers as Python dict literals), training steps only."""
        out = []
        for line in (self.stdout + "\n" + self.stderr).splitlines():
            line = line.strip()
            if line.startswith("{'loss'"):
                out.append({k: float(v) for k, v in ast.literal_eval(line).items()})
        return out

    def result(self) -> dict | None:
        found = [json.loads(ln[ln.index(RESULT) + len(RESULT):]) for ln in self.stdout.splitlines() if RESULT in ln]
        return found[-1] if found else None

    def error_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.startswith("grpo_trainer: ")]

    def __repr__(self) -> str:
        return (f"Run(rc={self.returncode}, wall={self.wall:.1f}s)\nSTDOUT:\n{self.stdout[-3000:]}\n"
                f"STDERR:\n{self.stderr[-6000:]}")


def start(cmd: list[str], environ: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=environ, stdout=kw.pop("stdout", subprocess.PIPE),
                            stderr=kw.pop("stderr", subprocess.PIPE), text=True, start_new_session=True, **kw)


def stop(proc: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM the process group of `proc`, SIGKILL it after `grace` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run(cmd: list[str], environ: dict, timeout: float) -> Run:
    t0 = time.monotonic()
    proc = start(cmd, environ)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc, grace=5)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s\nSTDOUT:\n{out[-3000:]}\nSTDERR:\n{err[-6000:]}") from None
    return Run(proc.returncode, out, err, time.monotonic() - t0)


def trainer_cmd(config: Path) -> list[str]:
    return [sys.executable, "-m", "grpo_trainer", "--config", str(config)]


def launch_cmd(config: Path, nproc: int) -> list[str]:
    return [sys.executable, "-m", "grpo_trainer.launch", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "grpo_trainer", "--config", str(config)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
