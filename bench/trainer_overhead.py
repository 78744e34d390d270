"""Per-step time of `python -m grpo_trainer` ÷ a plain TRL script with the identical config and model.

Both train the tiny example model (examples/local-tiny) on CPU with the same GRPOConfig, dataset, rewards and
seed; runs alternate (A B A B …) so that machine noise hits both alike. Per-step time = the Trainer's
train_runtime / steps (the whole training loop: generation, rewards, backward, callbacks, logging), so process
start-up and imports are excluded. Goal: ratio ≤ 1.03.

    python bench/trainer_overhead.py [--rounds 5] [--steps 20] [--nproc 1|2]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "examples" / "local-tiny" / "model"
DATA = REPO / "examples" / "local-tiny" / "data" / "arithmetic.jsonl"
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore", "GRPO_TERMINATION_LOG": os.devnull}

# The plain TRL baseline: what a user would write by hand for the same job.
PLAIN = r'''
import json, sys
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from grpo_trainer.rewards import accuracy, make_length

cfg = json.load(open(sys.argv[1]))
kw = dict(cfg["training"], output_dir=cfg["outputDir"], use_cpu=True, bf16=False, fp16=False, use_vllm=False,
          ddp_find_unused_parameters=False, reward_weights=[r["weight"] for r in cfg["rewards"]])
args = GRPOConfig(**kw)
tok = AutoTokenizer.from_pretrained(cfg["model"])
ds = load_dataset("json", data_files={"train": cfg["dataset"]["name"]}, split="train")
ds = ds.rename_column("question", "prompt").map(lambda r: {"prompt": [{"role": "user", "content": r["prompt"]}]})
model = AutoModelForCausalLM.from_pretrained(cfg["model"])
trainer = GRPOTrainer(model=model, reward_funcs=[accuracy, make_length(kw["max_completion_length"])], args=args,
                      train_dataset=ds, processing_class=tok)
trainer.train()
trainer.save_model(cfg["outputDir"])
'''


def config(out: Path, steps: int, per_device: int) -> dict:
    return {
        "schemaVersion": 1, "job": {"name": "bench", "namespace": "default", "uid": ""},
        "model": str(MODEL),
        "dataset": {"name": str(DATA), "config": None, "split": "train", "promptColumn": "question",
                    "answerColumn": "answer"},
        "rewards": [{"name": "accuracy", "function": None, "weight": 1.0},
                    {"name": "length", "function": None, "weight": 0.5}],
        "training": {"per_device_train_batch_size": per_device, "num_generations": 4, "gradient_accumulation_steps": 1,
                     "max_steps": steps, "max_completion_length": 16, "logging_steps": 1, "save_strategy": "no",
                     "learning_rate": 1e-4, "report_to": "none", "seed": 0, "disable_tqdm": True},
        "vllm": {"mode": "none", "tensorParallelSize": 1, "gpuMemoryUtilization": 0.3, "serverHost": None,
                 "serverPort": 8000},
        "outputDir": str(out), "progress": {"enabled": True},
    }


def logs(stdout: str) -> list[dict]:
    """The Trainer's printed log dicts (PrinterCallback, one per logging step plus the final summary)."""
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{'"):
            try:
                out.append({k: float(v) for k, v in ast.literal_eval(line).items()})
            except (ValueError, SyntaxError, TypeError):
                pass
    return out


def run(kind: str, cfg_path: Path, nproc: int, script: Path) -> float:
    target = ["-m", "grpo_trainer", "--config", str(cfg_path)] if kind == "grpo_trainer" else [str(script), str(cfg_path)]
    if nproc == 1:
        cmd = [sys.executable, *target]
    else:  # both under torchrun: ours with its exit-code wrapper, the baseline with plain torchrun
        launcher = ["-m", "grpo_trainer.launch"] if kind == "grpo_trainer" else ["-m", "torch.distributed.run"]
        cmd = [sys.executable, *launcher, "--standalone", f"--nproc-per-node={nproc}", *target]
    env = {**os.environ, **ENV, "PYTHONPATH": str(REPO / "trainer_image")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = [entry for entry in logs(proc.stdout) if "train_runtime" in entry]
    steps = json.loads(cfg_path.read_text())["training"]["max_steps"]
    return summary[-1]["train_runtime"] / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--nproc", type=int, default=1)
    a = ap.parse_args()
    per_device = 4 if a.nproc == 1 else 2
    times: dict[str, list[float]] = {"grpo_trainer": [], "plain_trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "plain_trl.py"
        script.write_text(PLAIN)
        t0 = time.monotonic()
        for kind in ("grpo_trainer", "plain_trl"):  # warm-up (file caches, first compilation): not counted
            cfg = Path(tmp) / f"{kind}-warmup.json"
            cfg.write_text(json.dumps(config(Path(tmp) / f"{kind}-warmup", 4, per_device)))
            run(kind, cfg, a.nproc, script)
        for r in range(a.rounds):
            order = ("grpo_trainer", "plain_trl") if r % 2 == 0 else ("plain_trl", "grpo_trainer")
            for kind in order:
                out = Path(tmp) / f"{kind}-{r}"
                cfg = Path(tmp) / f"{kind}-{r}.json"
                cfg.write_text(json.dumps(config(out, a.steps, per_device)))
                times[kind].append(run(kind, cfg, a.nproc, script))
            print(f"round {r + 1}/{a.rounds}: grpo_trainer {times['grpo_trainer'][-1] * 1000:.1f} ms/step, "
                  f"plain TRL {times['plain_trl'][-1] * 1000:.1f} ms/step", flush=True)
    ours, plain = statistics.median(times["grpo_trainer"]), statistics.median(times["plain_trl"])
    result = {"nproc": a.nproc, "steps": a.steps, "rounds": a.rounds,
              "grpo_trainer_ms_per_step": round(ours * 1000, 2), "plain_trl_ms_per_step": round(plain * 1000, 2),
              "ratio": round(ours / plain, 3),
              "median_pair_ratio": round(statistics.median(x / y for x, y in zip(times["grpo_trainer"],
                                                                                 times["plain_trl"], strict=False)), 3),
              "goal": 1.03, "wall_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
