"""Real short CPU runs of `python -m grpo_trainer` for the model-loading options (docs/trainer.md): a model that
ships its own code (trustRemoteCode), a reward model (rewards[].model), LoRA (spec.peft) with a resume."""

from __future__ import annotations

import json

import pytest

from grpo_trainer import exitcodes as ec
from tests.support.models import remote_code_model, reward_model
from tests.support.trainer import run, trainer_cmd

pytestmark = pytest.mark.slow

SHORT = {"max_steps": 2, "save_steps": 1}


def test_model_with_its_own_code_trains_only_with_trust_remote_code(tiny_config, tmp_path):
    model = remote_code_model(tmp_path / "remote-model")
    refused = run(trainer_cmd(tiny_config(model=model, training_kw=SHORT, output_dir=tmp_path / "refused")),
                  timeout=120)
    assert refused.returncode == ec.REMOTE_CODE, refused
    [line] = refused.error_lines()
    assert "remote code not trusted (exit 17)" in line and "trustRemoteCode" in line, line
    assert not (tmp_path / "refused" / "checkpoint-1").exists()  # failed before any training
    trusted = run(trainer_cmd(tiny_config(model=model, training_kw={**SHORT, "trust_remote_code": True})),
                  timeout=240)
    assert trusted.returncode == 0, trusted
    assert [p["step"] for p in trusted.progress] == [1, 2]
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["model_type"] == "tiny-remote" and saved["auto_map"]["AutoModelForCausalLM"], saved


def test_reward_model_scores_completions(tiny_config, tmp_path):
    rm = reward_model(tmp_path / "tiny-rm")
    cfg = tiny_config(rewards=[{"model": str(rm), "weight": 1.0}, {"name": "length", "weight": 0.5}],
                      training_kw=SHORT)
    r = run(trainer_cmd(cfg), timeout=240)
    assert r.returncode == 0, r
    assert [p["step"] for p in r.progress] == [1, 2]
    assert "rewards/tiny-rm/mean" in r.stdout, r  # the metric is named after the model


def test_lora_checkpoints_hold_the_adapter_and_resume(tiny_config, tmp_path):
    peft = {"r": 4, "alpha": 8, "dropout": 0.0, "targetModules": "all-linear"}
    first = run(trainer_cmd(tiny_config(peft=peft, training_kw=SHORT)), timeout=240)
    assert first.returncode == 0, first
    out = tmp_path / "out"
    for where in (out / "checkpoint-2", out):
        assert (where / "adapter_model.safetensors").exists() and (where / "adapter_config.json").exists(), where
        assert not (where / "model.safetensors").exists(), where  # the adapter only, no base weights
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8 and adapter["peft_type"] == "LORA"
    # a restarted job with more steps resumes from the adapter checkpoint
    resumed = run(trainer_cmd(tiny_config(peft=peft, training_kw={**SHORT, "max_steps": 3})), timeout=240)
    assert resumed.returncode == 0, resumed
    assert "resuming from" in resumed.stderr and str(out / "checkpoint-2") in resumed.stderr, resumed
    assert [p["step"] for p in resumed.progress] == [3], resumed
    assert resumed.result is not None and resumed.result["resumedFrom"] == str(out / "checkpoint-2")
    assert (out / "checkpoint-3" / "adapter_model.safetensors").exists()
