"""vLLM colocate vs transformers' generate on CPU: per-step time and generated tokens/s, same model and config.

Both sides run `python -m grpo_trainer` (the pod's entrypoint) on the tiny example model with the identical
config except `vllm.mode` (none | colocate), alternating (A B A B …) so that machine noise hits both alike.
- per-step time: the Trainer's train_runtime / steps (the whole loop: generation, rewards, backward, weight sync),
- generated tokens/s: Σ over steps of completions/mean_length × completions per step, ÷ train_runtime,
- set-up: the process's wall time minus train_runtime (imports, model load, and vLLM's engine start for colocate).
No goal on CPU: a figure. vLLM's files go to a temporary folder; VLLM_CPU_KVCACHE_SPACE=1 (GiB).

    python bench/vllm_bench.py [--rounds 2] [--steps 20] [--nproc 1|2] [--completion 32] [--batch 8] [--model small]

--model small: a 4-layer Qwen2 with hidden size 512 (~13M parameters, random weights, built here offline with the tiny
example's tokenizer): its completions run to max_completion_length, so both sides generate the same token count.
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
       "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore", "GRPO_TERMINATION_LOG": os.devnull,
       "VLLM_CPU_KVCACHE_SPACE": "1"}


def small_model(path: Path) -> Path:
    """A random 4-layer Qwen2 (hidden 512, 8 heads of 64, 2 KV heads) with the tiny example's tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(MODEL)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def config(out: Path, mode: str, steps: int, batch: int, completion: int, nproc: int, model: Path = MODEL) -> dict:
    return {
        "schemaVersion": 1, "job": {"name": "bench", "namespace": "local"}, "model": str(model),
        "dataset": {"name": str(DATA), "split": "train", "promptColumn": "question", "answerColumn": "answer"},
        "rewards": [{"name": "accuracy"}, {"name": "length", "weight": 0.5}],
        "training": {"per_device_train_batch_size": batch // nproc, "num_generations": 4,
                     "gradient_accumulation_steps": 1, "max_steps": steps, "max_completion_length": completion,
                     "logging_steps": 1, "save_strategy": "no", "learning_rate": 1e-5, "report_to": "none",
                     "seed": 0},
        "vllm": {"mode": mode, "gpuMemoryUtilization": 0.05},
        "outputDir": str(out), "progress": {"enabled": False},
    }


def one_run(mode: str, args, tmp: Path) -> dict:
    out = tmp / f"out-{mode}-{time.monotonic_ns()}"
    cfg = tmp / "config.json"
    cfg.write_text(json.dumps(config(out, mode, args.steps, args.batch, args.completion, args.nproc, args.model_path)))
    cmd = [sys.executable, "-m", "grpo_trainer", "--config", str(cfg)]
    if args.nproc > 1:
        cmd = [sys.executable, "-m", "grpo_trainer.launch", "--standalone", f"--nproc-per-node={args.nproc}",
               "-m", "grpo_trainer", "--config", str(cfg)]
    env = {**os.environ, **ENV, "TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
           "VLLM_RPC_BASE_PATH": str(tmp)}
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{mode} run failed ({p.returncode}):\n{p.stderr[-4000:]}")
    steps, runtime = [], None
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{'loss'"):
            steps.append(ast.literal_eval(line))
        elif line.startswith("{'train_runtime'"):
            runtime = float(ast.literal_eval(line)["train_runtime"])
    if runtime is None or len(steps) != args.steps:
        sys.exit(f"{mode}: could not read the per-step logs\n{p.stdout[-3000:]}")
    if mode == "colocate" and "generating with vLLM, colocate mode" not in p.stderr:
        sys.exit("colocate run did not generate with vLLM")
    tokens = sum(float(s["completions/mean_length"]) * args.batch for s in steps)
    return {"step_s": runtime / args.steps, "tokens_per_s": tokens / runtime, "setup_s": wall - runtime,
            "mean_length": tokens / args.batch / args.steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8, help="completions per step (all processes)")
    ap.add_argument("--completion", type=int, default=32, help="max_completion_length")
    ap.add_argument("--model", choices=("tiny", "small"), default="tiny")
    args = ap.parse_args()
    results: dict[str, list[dict]] = {"none": [], "colocate": []}
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as d:
        args.model_path = small_model(Path(d) / "small") if args.model == "small" else MODEL
        for r in range(args.rounds):
            for mode in (("none", "colocate") if r % 2 == 0 else ("colocate", "none")):
                res = one_run(mode, args, Path(d))
                results[mode].append(res)
                print(f"round {r + 1} {mode:9s} step {res['step_s'] * 1000:7.1f} ms  {res['tokens_per_s']:8.1f} "
                      f"generated tok/s  mean completion {res['mean_length']:.1f}  set-up {res['setup_s']:.1f} s",
                      flush=True)
    med = {m: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for m, rs in results.items()}
    print(json.dumps({"model": args.model, "nproc": args.nproc, "steps": args.steps, "batch": args.batch,
                      "maxCompletion": args.completion,
                      "median": med,
                      "colocate_over_transformers": {"step_time": med["colocate"]["step_s"] / med["none"]["step_s"],
                                                     "tokens_per_s": med["colocate"]["tokens_per_s"]
                                                     / med["none"]["tokens_per_s"]}}, indent=1))


if __name__ == "__main__":
    main()
