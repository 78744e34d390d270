"""grpo_trainer.launch's hooks on torchrun's agent, under a real torchrun (2 local workers, a stand-in worker script:
no model): a failed worker is restarted in place with GRPO_IN_PLACE_RESTARTS counting the generations, a permanent
exit code is never restarted in place, and in-place restarts past --max-restarts end the launcher retryably."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.trainer import REPO, env

WORKER = textwrap.dedent('''
    import os, pathlib, signal, sys, time
    out, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
    rank, gen = int(os.environ["RANK"]), int(os.environ["GRPO_IN_PLACE_RESTARTS"])
    (out / f"rank{rank}-gen{gen}").touch()
    failing = gen == 0 or mode == "always"
    if rank == 1 and failing:
        # rank 0 has started this generation (else the agent may stop it first, and its generation goes unrecorded)
        deadline = time.monotonic() + 120
        while not (out / f"rank0-gen{gen}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        if mode == "permanent":
            sys.exit(11)  # DatasetError: rerunning fails the same way
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0 and failing:
        time.sleep(120)  # the agent stops it when rank 1 fails
''')


CASES = [  # (mode, --max-restarts, the launcher's exit code, worker generations that ran)
    ("once", 2, 0, [0, 1]),  # killed once: restarted in place, then done
    ("permanent", 2, 11, [0]),  # a permanent code: no restart in place, the launcher exits with it
    ("always", 1, 137, [0, 1]),  # killed every time: after --max-restarts the launcher ends with SIGKILL's code
]


def test_launcher_restarts_in_place(tmp_path: Path) -> None:
    """The three cases run side by side (each pays torch's import once)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = []
    for mode, max_restarts, _, _ in CASES:
        out = tmp_path / mode
        out.mkdir()
        cmd = [sys.executable, "-m", "grpo_trainer.launch", "--standalone", "--nproc-per-node=2",
               f"--max-restarts={max_restarts}", "--monitor-interval=0.1", str(script), str(out), mode]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
    try:
        errs = [p.communicate(timeout=400)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for (mode, _, code, generations), p, err in zip(CASES, procs, errs, strict=True):
        assert p.returncode == code, (mode, err[-3000:])
        assert sorted(f.name for f in (tmp_path / mode).glob("rank*")) == sorted(
            f"rank{r}-gen{g}" for r in (0, 1) for g in generations), (mode, err[-3000:])
        restarted = [ln for ln in err.splitlines() if "grpo_trainer.launch: in-place restart" in ln]
        assert len(restarted) == len(generations) - 1, (mode, err[-3000:])
        assert ("exited with permanent code 11: not restarted in place" in err) == (mode == "permanent")
