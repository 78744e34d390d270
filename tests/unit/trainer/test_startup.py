"""The start-up record (grpo_trainer/startup.py): each phase's seconds run from the mark before it, a mark is never
moved, only global rank 0 prints, once, and the record names the in-place restart it belongs to."""

from __future__ import annotations

import io
import json
import time

from grpo_trainer import startup
from grpo_trainer.contract import IN_PLACE_RESTARTS_ENV, STARTUP_PREFIX


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_phases_are_the_gaps_between_marks_and_a_mark_never_moves(monkeypatch) -> None:
    monkeypatch.delenv(IN_PLACE_RESTARTS_ENV, raising=False)
    clock = Clock(102.0)
    s = startup.StartClock(began=100.0, clock=clock)
    for phase, at in (("imports", 102.0), ("prepare", 102.5), ("trl", 104.0), ("model", 105.0), ("restore", 105.25),
                      ("firstStep", 106.0)):
        clock.t = at
        s.mark(phase)
    clock.t = 200.0
    s.mark("firstStep")  # a later step: the first one's time stays
    rec = s.record()
    assert rec == {"processStart": 100.0, "imports": 2.0, "prepare": 0.5, "trl": 1.5, "model": 1.0, "restore": 0.25,
                   "firstStep": 0.75, "total": 6.0, "inPlaceRestart": 0}
    assert startup.sentence(rec) == ("first step 6.0 s after the process started: interpreter and torch 2.0 s, data, "
                                     "rewards and config 0.5 s, TRL import 1.5 s, model and trainer 1.0 s, checkpoint "
                                     "restore 0.2 s, first step 0.8 s")


def test_a_phase_not_reached_is_left_out_and_the_next_counts_from_the_last_mark(monkeypatch) -> None:
    monkeypatch.setenv(IN_PLACE_RESTARTS_ENV, "2")
    clock = Clock(10.0)
    s = startup.StartClock(began=9.0, clock=clock)
    s.mark("imports")
    clock.t = 13.0
    s.mark("firstStep")
    rec = s.record()
    assert rec == {"processStart": 9.0, "imports": 1.0, "firstStep": 3.0, "total": 4.0, "inPlaceRestart": 2}


def test_only_rank_0_prints_and_only_once(monkeypatch, capsys) -> None:
    s = startup.StartClock(began=1.0, clock=Clock(2.0))
    s.mark("firstStep")
    monkeypatch.setenv("RANK", "1")
    out = io.StringIO()
    startup.report(s, out)
    assert out.getvalue() == "" and not s.reported
    monkeypatch.setenv("RANK", "0")
    startup.report(s, out)
    startup.report(s, out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith(STARTUP_PREFIX)
    assert json.loads(lines[0][len(STARTUP_PREFIX):])["total"] == 1.0
    assert capsys.readouterr().err == "grpo_trainer: first step 1.0 s after the process started: first step 1.0 s\n"


def test_the_process_start_is_read_from_the_system() -> None:
    began = startup.process_start()
    assert began is not None and began <= time.time() and time.time() - began < 3600 * 24 * 365
