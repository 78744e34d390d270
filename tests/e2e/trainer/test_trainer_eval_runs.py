"""Evaluation on spec.dataset.evalSplit in a real GRPO run (CPU, the tiny model, offline, under a timeout).

Finding (issue 26): `training.evalStrategy: steps` was accepted but no eval dataset reached GRPOTrainer, so
transformers raised in the pod after the model loaded; admission now requires evalSplit and the trainer loads it."""

from __future__ import annotations

import json

import pytest

from tests.support.trainer import TINY_DATA, run, trainer_cmd

pytestmark = pytest.mark.slow


def test_eval_strategy_steps_evaluates_the_eval_split(tiny_config, tmp_path):
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text("".join(TINY_DATA.read_text().splitlines(keepends=True)[:4]))
    cfg = tiny_config(dataset={"evalSplit": "test", "evalName": str(held_out)},
                      training_kw={"eval_strategy": "steps", "eval_steps": 2, "per_device_eval_batch_size": 2,
                                   "max_steps": 4, "save_steps": 4})
    r = run(trainer_cmd(cfg), timeout=300)
    assert r.returncode == 0, r
    state = json.loads((tmp_path / "out" / "checkpoint-4" / "trainer_state.json").read_text())
    evals = [e for e in state["log_history"] if any(k.startswith("eval_") for k in e)]
    assert [e["step"] for e in evals] == [2, 4], state["log_history"]
    assert all("eval_reward" in e for e in evals), evals
