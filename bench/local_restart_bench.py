"""`grpojob run --local` of the README's tiny job, this tree beside another one, alternating (docs/performance.md,
"Fast starts"):

    .venv/bin/python bench/local_restart_bench.py --before /tmp/before [--rounds 3]

`--before`: a folder holding another tree's `operator/` and `trainer_image/` (`git archive REV operator trainer_image
| tar -x -C /tmp/before`). Per run: start → first step (the trainer's own timestamp of its first GRPO_PROGRESS line),
and SIGKILL of the rank-1 worker once checkpoint-2 is written → the first step of the restarted workers (the
launcher restarts them in place; a tree whose `run --local` does not restart in place shows no figure). Both trees
run the same example files and the same interpreter; only PYTHONPATH differs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is not a package: reach tests.support like `python -m pytest` does

from tests.support.processes import alive, descendants, rank_of


def one(tree: Path, tmp: Path) -> tuple[float, Optional[float]]:
    spec = yaml.safe_load((ROOT / "examples" / "local-tiny" / "grpojob.yaml").read_text())
    spec["spec"]["training"].update(maxSteps=40, saveSteps=2)
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(spec))
    out = tmp / "out"
    env = dict(os.environ, PYTHONPATH=f"{tree / 'operator'}{os.pathsep}{tree / 'trainer_image'}", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "grpo_operator.cli.grpojob", "run", "--local", str(job),
                             "--output-dir", str(out), "--no-progress", "--timeout", "400"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed: Optional[float] = None
    try:
        while proc.poll() is None and killed is None:
            if (out / "checkpoint-2" / "trainer_state.json").is_file():
                workers = [p for p in descendants(proc.pid) if rank_of(p) == "1" and alive(p)]
                if workers:
                    killed = time.time()
                    os.kill(min(workers), signal.SIGKILL)
            time.sleep(0.05)
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = (out / "train.log").read_text().splitlines()
    records = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("GRPO_PROGRESS ")]
    first = records[0]["timestamp"] - t0
    history = next((i for i, line in enumerate(lines) if line.startswith("GRPO_HISTORY ")), None)
    if proc.returncode != 0 or killed is None or history is None:
        return first, None  # not restarted in place
    resumed: list[dict[str, Any]] = [json.loads(line.split(" ", 1)[1]) for line in lines[history:]
                                     if line.startswith("GRPO_PROGRESS ")]
    return first, resumed[0]["timestamp"] - killed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    trees = {"this": ROOT, "before": a.before}
    runs: dict[str, list[tuple[float, Optional[float]]]] = {k: [] for k in trees}
    for i in range(a.rounds):
        for kind in ("this", "before") if i % 2 == 0 else ("before", "this"):
            with tempfile.TemporaryDirectory(prefix="local-restart-bench-") as tmp:
                runs[kind].append(one(trees[kind], Path(tmp)))
            first, restart = runs[kind][-1]
            shown = f"{restart:5.1f} s" if restart is not None else "  -  "
            print(f"round {i + 1} {kind:6}: first step {first:5.1f} s · SIGKILL → resumed step {shown} · load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    for kind, rows in runs.items():
        restarts = [r for _, r in rows if r is not None]
        print(f"median {kind:6}: first step {statistics.median(f for f, _ in rows):.1f} s" +
              (f" · restart {statistics.median(restarts):.1f} s" if restarts else ""))


if __name__ == "__main__":
    main()
