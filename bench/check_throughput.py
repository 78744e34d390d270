"""`grpojob check` throughput: specs validated per second in one process, on 10,000 generated specs.

Two figures side by side in one run: the validator alone (documents already parsed) and the whole command
(YAML parsing + validation + JSON output) on one multi-document file. About half the generated specs are invalid,
so the fix search (the expensive path) is exercised.

    .venv/bin/python bench/check_throughput.py [--specs 10000]
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import yaml

from grpo_operator.cli import grpojob as cli
from grpo_operator.rules import validation


def generate(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        training = {"perDeviceTrainBatchSize": rng.choice([1, 2, 3, 4, 8]),
                    "gradientAccumulationSteps": rng.choice([1, 2, 4]),
                    "numGenerations": rng.choice([2, 4, 6, 8, 12, 16]),
                    "learningRate": 1e-6, "maxSteps": 500}
        if rng.random() < 0.2:
            training["stepsPerGeneration"] = rng.choice([1, 2, 3])
        if rng.random() < 0.2:
            training["evalStrategy"] = "steps"
            training["perDeviceEvalBatchSize"] = rng.choice([2, 4, 8])
        docs.append({
            "apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": f"job-{i}"},
            "spec": {"model": "Qwen/Qwen2.5-1.5B-Instruct",
                     "dataset": {"name": "openai/gsm8k", "config": "main", "promptColumn": "question"},
                     "rewards": [{"name": "accuracy"}, {"name": "format", "weight": 0.5}],
                     "nodes": rng.choice([1, 2, 4]),
                     "resources": {"limits": {"nvidia.com/gpu": rng.choice([1, 2, 3, 4, 8])}},
                     "training": training,
                     "vllm": {"mode": rng.choice(["colocate", "server", "none"]), "tensorParallelSize": rng.choice([1, 1, 2])},
                     "output": {"volumeClaimName": "ckpt"}},
        })
    return docs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", type=int, default=10_000)
    args = ap.parse_args()
    docs = generate(args.specs)
    validation.validate(docs[0])  # warm caches (model building, the TRL field table)

    t = time.perf_counter()
    results = [validation.validate(d) for d in docs]
    validator_s = time.perf_counter() - t
    invalid = sum(not r.valid for r in results)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "specs.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        t = time.perf_counter()
        with redirect_stdout(io.StringIO()):
            code = cli.main(["check", str(path), "-o", "json"])
        command_s = time.perf_counter() - t

    n = len(docs)
    print(f"specs: {n} ({invalid} invalid), python {sys.version.split()[0]}")
    print(f"validator only:            {n / validator_s:8.0f} specs/s  ({validator_s * 1e6 / n:.0f} µs/spec)")
    print(f"grpojob check -o json:     {n / command_s:8.0f} specs/s  ({command_s:.2f} s; exit {code})")
    print(f"ratio command/validator:   {command_s / validator_s:.2f}")


if __name__ == "__main__":
    main()
