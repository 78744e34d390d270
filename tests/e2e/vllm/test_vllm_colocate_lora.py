"""vLLM colocate with LoRA (spec.peft) on CPU, for real: TRL merges the adapter into the base weights, pushes them to
vLLM and unmerges (VLLMGeneration._iter_named_params), so vLLM samples from base + adapter.

Measured as in test_vllm_colocate.py: TRL's per-step `sampling/sampling_logp_difference/max` (vLLM's logprobs of the
sampled tokens vs the training model's, which includes the adapter) stays at float32 rounding while the merged weights
reach vLLM, and jumps once the adapter has moved when they do not (negative control: TRL's sync as a no-op)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.trainer import run, trainer_cmd, write_config
from tests.support.vllm_runs import trl_logs, vllm_env

pytestmark = pytest.mark.slow

HELPERS = Path(__file__).resolve().parent / "helpers"
STEPS = 4
SYNCED = 1e-3  # vLLM vs trainer logprob difference with the merged weights in vLLM
STALE = 0.05  # ... with the base weights once the adapter has moved (lr 5e-2)
PEFT = {"r": 8, "alpha": 16, "dropout": 0.0, "targetModules": "all-linear"}


def lora_config(tmp_path: Path) -> Path:
    return write_config(tmp_path, vllm={"mode": "colocate", "gpuMemoryUtilization": 0.05}, peft=PEFT, training_kw={
        "max_steps": STEPS, "save_steps": 10, "learning_rate": 5e-2, "max_completion_length": 16,
        "num_generations": 4, "per_device_train_batch_size": 4})


def test_lora_merged_weights_reach_vllm(tmp_path):
    r = run(trainer_cmd(lora_config(tmp_path)), timeout=400, **vllm_env(tmp_path / "tmp"))
    assert r.returncode == 0, r
    assert "generating with vLLM, colocate mode" in r.stderr, r
    logs = trl_logs(r.stdout)
    assert len(logs) == STEPS and logs[0]["grad_norm"] > 0, logs
    diffs = [step["sampling/sampling_logp_difference/max"] for step in logs]
    assert max(diffs) < SYNCED, diffs
    out = tmp_path / "out"
    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8


def test_a_missing_lora_sync_is_seen(tmp_path):
    r = run([sys.executable, str(HELPERS / "nosync_trainer.py"), "--config", str(lora_config(tmp_path))], timeout=400,
            **vllm_env(tmp_path / "tmp"), PYTHONPATH=str(HELPERS))
    assert r.returncode == 0, r
    diffs = [step["sampling/sampling_logp_difference/max"] for step in trl_logs(r.stdout)]
    assert len(diffs) == STEPS and diffs[0] < SYNCED and max(diffs[1:]) > STALE, diffs
