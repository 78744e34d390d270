"""Every training process publishes its phase, heartbeat and per-phase seconds (grpo_trainer/phases.py); the node's
metrics server shows all of them and answers POST /stacks with every process's stacks (faulthandler on a signal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from grpo_trainer import contract as C
from grpo_trainer import phases
from grpo_trainer.metrics import TrainerMetrics
from tests.support.cluster.util import free_port, wait_until


class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_phases_nest_and_count_the_innermost_phase() -> None:
    t = FakeTime()
    clock = phases.PhaseClock(0, clock=t)
    assert clock.phase == "loading"
    t.t += 30
    clock.set(C.PHASE_TRAINING)
    t.t += 1
    with clock.within(C.PHASE_GENERATING):
        t.t += 4
        with clock.within(C.PHASE_WEIGHT_SYNC):
            t.t += 2
            assert clock.phase == "weight-sync"
        assert (clock.phase, clock.record()["since"]) == ("generating", 1037.0)  # resumed now
        t.t += 3
    t.t += 5
    rec = clock.record()
    assert rec["phase"] == "training" and rec["since"] == 1040.0 and rec["heartbeat"] == 1045.0
    assert rec["seconds"] == {"loading": 30.0, "training": 6.0, "generating": 7.0, "weight-sync": 2.0}


def test_a_blocked_reward_is_the_phase_while_it_blocks() -> None:
    clock = phases.PhaseClock(3)

    class Trainer:
        def _calculate_rewards(self, *a: object) -> str:
            return clock.phase

        def _generate(self, *a: object) -> str:
            return clock.phase

    tr = Trainer()
    assert set(phases.instrument(tr, clock)) == {"_calculate_rewards", "_generate"}
    assert tr._calculate_rewards() == "rewards" and tr._generate() == "generating"
    assert phases.instrument(tr, clock) == []  # idempotent: never wrapped twice
    assert clock.phase == "loading"


def test_the_metrics_endpoint_shows_every_local_rank(tmp_path: Path) -> None:
    for rank in (0, 1):
        c = phases.PhaseClock(rank, directory=str(tmp_path))
        c.set(C.PHASE_REWARDS if rank else C.PHASE_TRAINING)
        c.step = 7
        c.publish()
    # a record whose process is gone is not published
    (tmp_path / f"rank-9{phases.BEAT_SUFFIX}").write_text(json.dumps({"rank": 9, "pid": 2**22 + 7, "phase": "x"}))
    m = TrainerMetrics(global_rank0=True)
    m.watch_ranks(str(tmp_path))
    fams = {f.name: f for f in text_string_to_metric_families(m.text())}
    phase = {(s.labels["rank"], s.labels["phase"]) for s in fams["grpo_trainer_rank_phase"].samples}
    assert phase == {("0", "training"), ("1", "rewards")}
    assert {s.labels["rank"]: s.value for s in fams["grpo_trainer_rank_step"].samples} == {"0": 7.0, "1": 7.0}
    assert len(fams["grpo_trainer_rank_heartbeat_timestamp_seconds"].samples) == 2
    assert {s.labels["phase"] for s in fams["grpo_trainer_phase_seconds"].samples} >= {"loading", "rewards"}


BLOCKED = textwrap.dedent("""
    import sys, threading, time
    from grpo_trainer import phases
    clock = phases.PhaseClock(int(sys.argv[1]), directory=sys.argv[2], interval=0.1,
                              stacks=sys.argv[3] if phases.register_stacks(sys.argv[3]) else "").start()
    def my_reward_that_never_returns():
        threading.Event().wait()
    with clock.within("rewards"):
        print("blocked", flush=True)
        my_reward_that_never_returns()
""")


def test_post_stacks_dumps_every_live_process_and_names_the_blocked_function(tmp_path: Path) -> None:
    beats, out = tmp_path / "beats", tmp_path / "out"
    procs = []
    try:
        for rank in (0, 1):
            p = subprocess.Popen([sys.executable, "-c", BLOCKED, str(rank), str(beats),
                                  phases.stacks_path(str(out), "2", rank)], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ})
            procs.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "blocked"
        procs[1].send_signal(19)  # SIGSTOP: runs no handler; its file stays empty

        def published() -> bool:  # rank 0's clock publishes every 0.1 s: under load its record may still say
            by_rank = {r["rank"]: r.get("phase") for r in phases.read_beats(str(beats))}  # loading at "blocked"
            return by_rank.keys() == {0, 1} and by_rank[0] == "rewards"

        wait_until(published, 30, what="both beat records, rank 0's in rewards")
        m = TrainerMetrics(global_rank0=True)
        m.watch_ranks(str(beats))
        port = free_port()
        assert m.serve(port, "127.0.0.1")
        with pytest.raises(urllib.error.HTTPError):  # a GET does nothing
            urllib.request.urlopen(f"http://127.0.0.1:{port}{C.STACKS_PATH}", timeout=10)
        req = urllib.request.Request(f"http://127.0.0.1:{port}{C.STACKS_PATH}", data=b"", method="POST")
        ranks = json.load(urllib.request.urlopen(req, timeout=30))["ranks"]
        assert ranks["0"]["dumped"] and ranks["0"]["phase"] == "rewards"
        assert "my_reward_that_never_returns" in ranks["0"]["stack"]
        assert ranks["0"]["file"] == str(out / "stalls" / "attempt-2" / "rank-0.txt")
        assert "my_reward_that_never_returns" in Path(ranks["0"]["file"]).read_text()
        assert ranks["1"]["dumped"] is False and ranks["1"]["stack"] == ""
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)
