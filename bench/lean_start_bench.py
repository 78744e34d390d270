"""The trainer's imports with and without hiding the packages a job does not use (docs/performance.md, "Fast starts").

    .venv/bin/python bench/lean_start_bench.py [--rounds 3]

Alternating fresh interpreters, each importing what train.run() imports before the first step of a vllm.mode none
job without trackers (grpo_trainer.train, then TRL's GRPOTrainer), once as the trainer does it (vLLM, wandb and
trackio hidden: grpo_trainer/lean_imports.py) and once loading everything installed, as before. Reported per round:
CPU seconds of the child (user + system: steadier than wall time on a shared machine), wall seconds, modules loaded;
then the medians and the ratio lean ÷ all.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import sys
from grpo_trainer import lean_imports, train
if sys.argv[1] == "lean":
    lean_imports.hide(lean_imports.unused(False, []))
from trl import GRPOTrainer
print(sum(1 for v in sys.modules.values() if v is not None))
"""


def one(kind: str) -> tuple[float, float, int]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'trainer_image'}{os.pathsep}{ROOT / 'operator'}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", PROBE, kind], env=env, check=True, capture_output=True, text=True)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, int(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    rounds = ap.parse_args().rounds
    runs: dict[str, list[tuple[float, float, int]]] = {"lean": [], "all": []}
    for i in range(rounds):
        for kind in ("lean", "all") if i % 2 == 0 else ("all", "lean"):
            runs[kind].append(one(kind))
            cpu, wall, mods = runs[kind][-1]
            print(f"round {i + 1} {kind:4}: {cpu:5.1f} CPU-s  {wall:5.1f} s wall  {mods} modules", flush=True)
    med = {k: (statistics.median(c for c, _, _ in v), statistics.median(w for _, w, _ in v)) for k, v in runs.items()}
    for k, (cpu, wall) in med.items():
        print(f"median {k:4}: {cpu:5.1f} CPU-s  {wall:5.1f} s wall")
    print(f"lean ÷ all: CPU {med['lean'][0] / med['all'][0]:.2f}, wall {med['lean'][1] / med['all'][1]:.2f}")


if __name__ == "__main__":
    main()
