"""Shared helpers for the trainer tests: offline env, config JSON (docs/trainer-config.md), runs under timeouts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "local-tiny"
TINY_MODEL = TINY / "model"
TINY_DATA = TINY / "data" / "arithmetic.jsonl"
HELPERS = Path(__file__).resolve().parent / "rewards"  # custom reward modules, on PYTHONPATH as in a pod

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
for _k, _v in OFFLINE.items():
    os.environ.setdefault(_k, _v)

PROGRESS = "GRPO_PROGRESS "
RESULT = "GRPO_RESULT "


def training(**overrides) -> dict:
    """Small, fast GRPOConfig kwargs (TRL names) for the tiny model."""
    base = {"per_device_train_batch_size": 2, "num_generations": 2, "gradient_accumulation_steps": 1,
            "max_steps": 4, "max_completion_length": 8, "logging_steps": 1, "save_steps": 2,
            "learning_rate": 1e-4, "report_to": "none", "seed": 0}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def config_doc(output_dir, *, model=None, dataset=None, rewards=None, training_kw=None, vllm=None,
               progress=True, **top) -> dict:
    """A trainer config document exactly as the operator renders it (docs/trainer-config.md)."""
    doc = {
        "schemaVersion": 1,
        "job": {"name": "test", "namespace": "default", "uid": ""},
        "model": str(model or TINY_MODEL),
        "dataset": {"name": str(TINY_DATA), "config": None, "split": "train",
                    "promptColumn": "question", "answerColumn": "answer", **(dataset or {})},
        "rewards": rewards if rewards is not None else [
            {"name": "accuracy", "function": None, "weight": 1.0},
            {"name": "length", "function": None, "weight": 0.5}],
        "training": training(**(training_kw or {})),
        "vllm": {"mode": "none", "tensorParallelSize": 1, "gpuMemoryUtilization": 0.3,
                 "serverHost": None, "serverPort": 8000, **(vllm or {})},
        "outputDir": str(output_dir),
        "progress": {"enabled": progress},
    }
    doc.update(top)
    return doc


def write_config(tmp_path, name="config.json", **kw) -> Path:
    out = Path(tmp_path) / "out"
    kw.setdefault("output_dir", out)
    output_dir = kw.pop("output_dir")
    path = Path(tmp_path) / name
    path.write_text(json.dumps(config_doc(output_dir, **kw)))
    return path


def env(**extra) -> dict:
    e = dict(os.environ)
    e.update(OFFLINE)
    e["GRPO_TERMINATION_LOG"] = os.devnull
    e["PYTHONPATH"] = os.pathsep.join([str(HELPERS)] + [p for p in [e.get("PYTHONPATH")] if p])
    e.update({k: str(v) for k, v in extra.items()})
    return e


def trainer_cmd(config) -> list[str]:
    return [sys.executable, "-m", "grpo_trainer", "--config", str(config)]


def launch_cmd(config, *torchrun_args) -> list[str]:
    return [sys.executable, "-m", "grpo_trainer.launch", *torchrun_args, "-m", "grpo_trainer", "--config", str(config)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """A finished process: exit code, output, parsed progress lines, wall time."""

    def __init__(self, returncode, stdout, stderr, wall):
        self.returncode, self.stdout, self.stderr, self.wall = returncode, stdout, stderr, wall

    @property
    def progress(self) -> list[dict]:
        return parse(self.stdout, PROGRESS)

    @property
    def result(self) -> dict | None:
        found = parse(self.stdout, RESULT)
        return found[-1] if found else None

    def error_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.startswith("grpo_trainer: ")]

    def __repr__(self):
        return f"Run(rc={self.returncode}, wall={self.wall:.1f}s)\nSTDOUT:\n{self.stdout[-3000:]}\nSTDERR:\n{self.stderr[-5000:]}"


def parse(text: str, prefix: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        i = line.find(prefix)
        if i >= 0:
            out.append(json.loads(line[i + len(prefix):]))
    return out


def start(cmd, **extra_env) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=env(**extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float, t0: float | None = None) -> Run:
    t0 = t0 or time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s\nSTDOUT:\n{out[-3000:]}\nSTDERR:\n{err[-5000:]}") from None
    return Run(proc.returncode, out, err, time.monotonic() - t0)


def run(cmd, timeout: float = 240, **extra_env) -> Run:
    t0 = time.monotonic()
    return finish(start(cmd, **extra_env), timeout, t0)


def kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture
def tiny_config(tmp_path):
    """Write a config for the tiny example; returns a function taking config_doc keyword overrides."""
    counter = iter(range(1000))

    def make(**kw) -> Path:
        return write_config(tmp_path, name=f"config-{next(counter)}.json", **kw)

    return make


@pytest.fixture
def helpers_on_path(monkeypatch):
    """tests/support/rewards on sys.path, as a ConfigMap-mounted reward module would be on PYTHONPATH in a pod."""
    monkeypatch.syspath_prepend(str(HELPERS))
    yield
    for name in ("my_rewards", "broken_rewards"):
        sys.modules.pop(name, None)


def offline_env(**extra: str) -> dict[str, str]:
    """This process's environment, offline (HF), plus `extra`: for child processes that must never reach a hub."""
    out = dict(os.environ)
    out.update(OFFLINE)
    out.update(extra)
    return out
