"""Interrupt real 2-process runs and restart them: SIGTERM saves and exits 143, a killed worker exits retryably,
and every restart resumes from the latest complete checkpoint (steps continue; none repeated beyond save_steps)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from grpo_trainer import exitcodes as ec
from tests.support.processes import descendants, rank_of
from tests.support.trainer import PROGRESS, Run, kill_group, launch_cmd, run, start

pytestmark = pytest.mark.slow

MAX_STEPS, SAVE_STEPS = 8, 2


class Watched:
    """A running job whose stdout/stderr are collected by threads, so the test can act on progress lines."""

    def __init__(self, cmd, **env):
        self.t0 = time.monotonic()
        self.proc = start(cmd, **env)
        self.out: list[str] = []
        self.err: list[str] = []
        self.threads = [threading.Thread(target=self._pump, args=(s, buf), daemon=True)
                        for s, buf in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self.threads:
            t.start()

    @staticmethod
    def _pump(stream, buf):
        for line in stream:
            buf.append(line)

    def steps(self) -> list[int]:
        return [json.loads(ln[ln.index(PROGRESS) + len(PROGRESS):])["step"] for ln in list(self.out) if PROGRESS in ln]

    def wait_for_step(self, step: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.steps() and self.steps()[-1] >= step:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"exited early: {self.finish(1)}")
            time.sleep(0.05)
        kill_group(self.proc)
        raise AssertionError(f"step {step} not reached: {self.finish(5)}")

    def finish(self, timeout: float = 120) -> Run:
        try:
            self.proc.wait(timeout=timeout)
        except Exception:
            kill_group(self.proc)
            self.proc.wait()
        for t in self.threads:
            t.join(5)
        return Run(self.proc.returncode, "".join(self.out), "".join(self.err), time.monotonic() - self.t0)


def resumed_from(r: Run) -> int | None:
    for line in r.stderr.splitlines():
        if line.startswith("grpo_trainer: resuming from "):
            return int(line.rsplit("checkpoint-", 1)[1])
    return None


def replayed(r: Run) -> list[tuple[int, int]]:
    """(attempt, step) of the GRPO_HISTORY lines, read as `kubectl grpo plot` reads them."""
    from grpo_operator.client import history

    return [(s.attempt, s.step) for ln in r.stdout.splitlines()
            if (s := history.parse_line(ln, attempt=99)) is not None and s.replayed]


def test_sigterm_then_worker_kill_then_resume_to_the_end(tiny_config, tmp_path):
    out = tmp_path / "out"
    cfg = tiny_config(rewards=[{"name": "accuracy"}, {"function": "my_rewards:slow"}],
                      training_kw={"num_generations": 4, "max_steps": MAX_STEPS, "save_steps": SAVE_STEPS})
    cmd = launch_cmd(cfg, "--standalone", "--nproc-per-node", "2")
    slow = {"SLOW_REWARD_SECONDS": "0.3"}

    # 1. SIGTERM to the agent (what the kubelet sends on eviction/deletion): all ranks finish the current step,
    #    save a checkpoint at that step, and the job exits 143 (retryable).
    job = Watched(cmd, GRPO_ATTEMPT="0", **slow)  # the attempt, as the pod's env says it
    job.wait_for_step(3)
    job.proc.send_signal(signal.SIGTERM)
    r1 = job.finish()
    assert r1.returncode == ec.PREEMPTED, r1
    stopped = r1.progress[-1]["step"]
    assert 3 <= stopped < MAX_STEPS and (out / f"checkpoint-{stopped}" / "trainer_state.json").exists(), r1
    assert "SIGTERM: stopped at step" in r1.stderr

    # 2. Restart: resumes exactly where SIGTERM stopped (no step repeated); then SIGKILL one worker after a
    #    later checkpoint: the job ends with a retryable code (>= 128) — never a permanent one.
    job = Watched(cmd, GRPO_ATTEMPT="1", **slow)
    job.wait_for_step(stopped + 3)
    ckpts = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    victims = [pid for pid in descendants(job.proc.pid) if rank_of(pid) == "1"]
    assert len(victims) == 1, descendants(job.proc.pid)
    os.kill(victims[0], signal.SIGKILL)
    r2 = job.finish()
    assert ec.is_retryable(r2.returncode), r2
    assert resumed_from(r2) == stopped, r2
    steps2 = [p["step"] for p in r2.progress]
    assert steps2[0] == stopped + 1, r2
    killed_at = steps2[-1]

    # 3. Restart again: resumes from the latest complete checkpoint, repeats at most SAVE_STEPS steps, finishes.
    r3 = run(cmd, timeout=240, GRPO_ATTEMPT="2")
    assert r3.returncode == 0, r3
    start_from = resumed_from(r3)
    assert start_from is not None and start_from >= max(ckpts), r3
    assert 0 <= killed_at - start_from <= SAVE_STEPS, (killed_at, start_from)
    steps3 = [p["step"] for p in r3.progress]
    assert steps3 == list(range(start_from + 1, MAX_STEPS + 1)), r3
    assert r3.result["resumedFrom"].endswith(f"checkpoint-{start_from}")
    state = json.loads((out / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
    # 4. A restart after the job already finished (e.g. another node failed in teardown) trains nothing more.
    r4 = run(cmd, timeout=240, GRPO_ATTEMPT="3")
    assert r4.returncode == 0 and "already reached max_steps=8" in r4.stderr and not r4.progress, r4
    assert not (out / f"checkpoint-{MAX_STEPS + 1}").exists()
    # 5. The history `kubectl grpo plot` draws: each resumed run re-printed its checkpoint's logged steps, each with the
    #    attempt that logged it (after a gang restart the earlier attempts' pods and logs are gone).
    assert replayed(r2) == [(0, s) for s in range(1, stopped + 1)], r2
    assert replayed(r3) == [(0 if s <= stopped else 1, s) for s in range(1, start_from + 1)], r3
    assert replayed(r4) == [(0 if s <= stopped else 1 if s <= start_from else 2, s) for s in range(1, MAX_STEPS + 1)]
    assert not replayed(r1)
    print(f"resume: SIGTERM run {r1.wall:.1f}s (stopped at {stopped}), killed run {r2.wall:.1f}s "
          f"(exit {r2.returncode}, killed at {killed_at}), final run {r3.wall:.1f}s (from {start_from})")
