"""Two "nodes" (two torchrun agents, c10d on loopback, the operator's own command line) of real GRPO: SIGKILL of global
rank 1's worker process → both agents restart their workers in place (a new rendezvous round, the same agent
processes: what stays a pod), the workers resume from the latest checkpoint, rank 0's metrics report the in-place
restart as the operator reads them, and the job finishes with every step trained."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from grpo_operator.lifecycle import progress as progress_mod
from grpo_operator.render import manifests
from tests.support.node import children_with_rank
from tests.support.trainer import PROGRESS, Run, free_port, kill_group, start

pytestmark = pytest.mark.slow

MAX_STEPS = 4


class Agent:
    """One node's launcher, its output collected by threads."""

    def __init__(self, cmd: list[str], **env: str):
        self.t0 = time.monotonic()
        self.proc = start(cmd, **env)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=lambda s=stream, b=buf: b.extend(s), daemon=True)
                        for stream, buf in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self.readers:
            t.start()

    def finish(self, timeout: float) -> Run:
        try:
            self.proc.wait(timeout=timeout)
        except Exception:
            kill_group(self.proc)
            self.proc.wait()
        for t in self.readers:  # they drain the pipes, closed once every process holding them exited
            t.join(timeout=30)
        return Run(self.proc.returncode, "".join(self.out), "".join(self.err), time.monotonic() - self.t0)


workers_of = children_with_rank  # the launcher's child processes → their RANK (torchrun's workers)


def wait_for(what: str, check, agents: list[Agent], timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if any(a.proc.poll() is not None for a in agents):
            raise AssertionError(f"an agent exited while waiting for {what}: "
                                 + "\n".join("".join(a.err)[-3000:] for a in agents))
        time.sleep(0.1)
    for a in agents:
        kill_group(a.proc)
    raise AssertionError(f"timed out waiting for {what}")


def scrape(ports: list[int]):
    """status.progress as the operator computes it from the nodes' metrics endpoints (lifecycle/progress.py)."""
    found = []
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                found.append(progress_mod.parse_metrics(r.read().decode(), pod=str(port)))
        except OSError:
            continue
    chosen = progress_mod.choose_rank0(found)
    return progress_mod.to_progress(chosen) if chosen is not None else None


def test_two_nodes_restart_in_place_after_a_worker_is_killed(tiny_config, tmp_path):
    out = tmp_path / "out"
    ports = [free_port(), free_port()]
    training = {"num_generations": 4, "max_steps": MAX_STEPS, "save_steps": 1}
    rewards = [{"name": "accuracy"}, {"function": "my_rewards:slow"}]
    # one config per node only for its metrics port (two pods have one each; here they share an address)
    configs = [tiny_config(rewards=rewards, training_kw=training) for _ in ports]
    for cfg, port in zip(configs, ports, strict=True):
        doc = json.loads(cfg.read_text())
        doc["progress"]["metricsPort"] = port
        cfg.write_text(json.dumps(doc))
    endpoint = f"127.0.0.1:{free_port()}"
    agents = []
    for cfg in configs:
        argv = manifests.torchrun_argv(2, 1, endpoint, "in-place", str(cfg), max_restarts=2)  # as a pod runs it
        argv[0] = sys.executable
        agents.append(Agent(argv, GRPO_ATTEMPT="0", SLOW_REWARD_SECONDS="0.3"))
    launchers = [a.proc.pid for a in agents]

    # 1. after the checkpoint of step 2: SIGKILL the worker process that is global rank 1 (either node's)
    wait_for("checkpoint-2", lambda: (out / "checkpoint-2" / "trainer_state.json").exists(), agents)
    victims = [pid for a in agents for pid, rank in workers_of(a.proc.pid).items() if rank == "1"]
    assert len(victims) == 1, [workers_of(a.proc.pid) for a in agents]
    os.kill(victims[0], signal.SIGKILL)
    killed = time.monotonic()

    # 2. both agents restart their workers in place; rank 0's metrics say so, for attempt 0, as the operator reads it
    live = wait_for("the in-place restart in the metrics",
                    lambda: (p := scrape(ports)) is not None and p.get("inPlaceRestarts") == 1 and p, agents)
    assert live["attempt"] == 0 and live["step"] >= 2, live
    runs = [a.finish(timeout=300) for a in agents]
    assert [r.returncode for r in runs] == [0, 0], runs
    assert [a.proc.pid for a in agents] == launchers  # the same agents throughout: nothing was recreated

    # 3. every node's agent started its workers a second time, and they resumed from a checkpoint of step >= 2
    for r in runs:
        assert r.stderr.count("grpo_trainer.launch: in-place restart 1:") == 1, r
        assert "in-place restart 2" not in r.stderr, r
    resumed = {int(ln.rsplit("checkpoint-", 1)[1]) for r in runs for ln in r.stderr.splitlines()
               if ln.startswith("grpo_trainer: resuming from ")}
    assert len(resumed) == 1 and 2 <= min(resumed) < MAX_STEPS, runs
    start_from = resumed.pop()
    # 4. global rank 0 (on either node, before and after) logged every step; none up to the checkpoint twice, and
    #    those after it at most twice (once before the kill, once resumed)
    steps = [json.loads(ln[ln.index(PROGRESS) + len(PROGRESS):])["step"] for r in runs
             for ln in r.stdout.splitlines() if PROGRESS in ln]
    assert sorted(set(steps)) == list(range(1, MAX_STEPS + 1)), steps
    assert all(steps.count(s) == 1 for s in range(1, start_from + 1)), steps
    assert all(1 <= steps.count(s) <= 2 for s in range(start_from + 1, MAX_STEPS + 1)), steps
    state = json.loads((out / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS and (Path(out) / "model.safetensors").exists()
    print(f"in place: killed at ~step {live['step']}, resumed from checkpoint-{start_from}, "
          f"finished {time.monotonic() - killed:.1f}s after the kill")
