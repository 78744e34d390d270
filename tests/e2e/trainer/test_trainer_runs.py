"""Real GRPO runs of `python -m grpo_trainer` on CPU with the tiny example model (offline, under timeouts).

Single process, 2 processes under the torchrun wrapper, TRL's in-pod batch error, custom reward import, bad inputs
before any training. Two "nodes" (two agents, c10d on loopback, the pods' command line) train in
test_trainer_in_place_runs.py, through a worker killed and restarted in place.
"""

from __future__ import annotations

import json

import pytest

from grpo_trainer import exitcodes as ec
from tests.support.trainer import launch_cmd, run, trainer_cmd

pytestmark = pytest.mark.slow


def assert_trained(r, out_dir, max_steps):
    assert r.returncode == 0, r
    steps = [p["step"] for p in r.progress]
    assert steps == list(range(1, max_steps + 1)), r
    assert all(p["maxSteps"] == max_steps and p["reward"] is not None for p in r.progress)
    assert (out_dir / "model.safetensors").exists() and (out_dir / f"checkpoint-{max_steps}").is_dir()
    state = json.loads((out_dir / f"checkpoint-{max_steps}" / "trainer_state.json").read_text())
    assert state["global_step"] == max_steps


def test_single_process_with_custom_reward(tiny_config, tmp_path):
    marker = tmp_path / "calls.txt"
    cfg = tiny_config(rewards=[{"name": "accuracy", "weight": 1.0}, {"name": "length", "weight": 0.5},
                               {"function": "my_rewards:digits", "weight": 0.25}],
                      training_kw={"per_device_train_batch_size": 4, "num_generations": 4, "bf16": True})
    r = run(trainer_cmd(cfg), timeout=180, MY_REWARDS_MARKER=marker)
    assert_trained(r, tmp_path / "out", 4)
    assert "bf16/fp16 requested but no GPU" in r.stderr
    assert marker.read_text().split() == ["4"] * 4  # the custom reward scored 4 completions per step
    assert "rewards/digits/mean" in r.stdout
    assert r.result == {"step": 4, "maxSteps": 4, "reward": r.progress[-1]["reward"], "outputDir": str(tmp_path / "out"),
                        "checkpoint": str(tmp_path / "out" / "checkpoint-4"), "resumedFrom": None}
    print(f"single process: {r.wall:.1f}s")


def test_two_processes_torchrun(tiny_config, tmp_path):
    cfg = tiny_config(training_kw={"num_generations": 4, "max_steps": 4})
    r = run(launch_cmd(cfg, "--standalone", "--nproc-per-node", "2"), timeout=240)
    assert_trained(r, tmp_path / "out", 4)  # progress only from global rank 0: no duplicated steps
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoint-4").glob("rng_state_*.pth")) == \
        ["rng_state_0.pth", "rng_state_1.pth"]
    print(f"2 processes: {r.wall:.1f}s")


def test_trl_batch_error_under_torchrun_is_permanent_and_matches_grpojob_check(tiny_config, tmp_path):
    from grpo_operator.rules.batch import BatchInput, check

    cfg = tiny_config(training_kw={"per_device_train_batch_size": 1, "num_generations": 4})
    r = run(launch_cmd(cfg, "--standalone", "--nproc-per-node", "2"), timeout=180)
    assert r.returncode == ec.BATCH, r
    expected = check(BatchInput(nodes=1, nproc=2, per_device=1, grad_accum=1, num_generations=4, vllm_mode="none"))
    assert [i.code for i in expected.issues] == ["E4"]
    lines = set(r.error_lines())  # one line per rank, all the same
    assert lines == {f"grpo_trainer: batch size error (exit 13): TRL rejected the batch sizes at world size 2: "
                     f"{expected.issues[0].message}"}, r
    out = tmp_path / "out"  # checked for writability (may exist), nothing written into it
    assert "Traceback" not in r.stderr and (not out.exists() or not any(out.iterdir())), r


@pytest.mark.parametrize("kw, code, needle", [
    ({"dataset": {"promptColumn": "q"}}, ec.DATASET,
     "has no column 'q' (spec.dataset.promptColumn); its columns are: question, answer"),
    ({"dataset": {"answerColumn": "solution"}}, ec.DATASET, "has no column 'solution'"),
    ({"rewards": [{"function": "no_such_module:score"}]}, ec.REWARD, "cannot import module 'no_such_module'"),
    ({"rewards": [{"function": "my_rewards:nope"}]}, ec.REWARD, "has no attribute 'nope'"),
    ({"rewards": [{"name": "lenght"}]}, ec.REWARD, "unknown built-in reward 'lenght'; use one of accuracy"),
    ({"training_kw": {"num_generation": 4}}, ec.CONFIG, "unknown GRPOConfig argument(s) num_generation"),
    ({"training_kw": {"learning_rate": "fast"}}, ec.CONFIG, "'training.learning_rate' must be a number, got str"),
    ({"training_kw": {"lr_scheduler_type": "bogus"}}, ec.CONFIG, "invalid training arguments"),
    ({"model": "/nonexistent/model"}, ec.MODEL, "model path /nonexistent/model does not exist"),
])
def test_bad_inputs_fail_before_training_with_one_line(tiny_config, tmp_path, kw, code, needle):
    cfg = tiny_config(**kw)
    r = run(trainer_cmd(cfg), timeout=120)
    assert r.returncode == code, r
    lines = r.error_lines()
    assert len(lines) == 1 and needle in lines[0] and f"(exit {code})" in lines[0], r
    # The output volume is checked for writability first (it may be created), but nothing is written into it.
    out = tmp_path / "out"
    assert "Traceback" not in r.stderr and not r.progress and (not out.exists() or not any(out.iterdir())), r


def test_bad_input_under_torchrun_keeps_its_code(tiny_config, tmp_path):
    cfg = tiny_config(dataset={"promptColumn": "q"}, training_kw={"num_generations": 4})
    r = run(launch_cmd(cfg, "--standalone", "--nproc-per-node", "2"), timeout=180)
    assert r.returncode == ec.DATASET, r
    lines = set(r.error_lines())
    assert len(lines) == 1 and "(exit 11)" in lines.pop() and "Traceback" not in r.stderr
