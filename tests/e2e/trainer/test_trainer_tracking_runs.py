"""reportTo in real runs with the CPU image's lock (tensorboard, wandb and trackio are in both images): TensorBoard's event
files land on the output volume, one directory per attempt (grpo_trainer/tracking.py), and hold the steps the trainer
reported; wandb in offline mode writes its run (id = the job's uid) there and opens no connection."""

from __future__ import annotations

import socket

import pytest

from tests.support.trainer import run, trainer_cmd

pytestmark = pytest.mark.slow


def test_tensorboard_logs_each_step_under_the_attempts_directory(tiny_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(training_kw={"report_to": ["tensorboard"], "max_steps": 2, "save_steps": 2})
    r = run(trainer_cmd(cfg), timeout=180, GRPO_ATTEMPT=3)
    assert r.returncode == 0, r
    logdir = tmp_path / "out" / "tensorboard" / "attempt-3"
    assert list(logdir.glob("events.out.tfevents.*")), sorted(p.name for p in (tmp_path / "out").rglob("*"))
    events = EventAccumulator(str(logdir))
    events.Reload()
    rewards = events.Scalars("train/reward")
    assert [e.step for e in rewards] == [1, 2]
    assert [round(e.value, 4) for e in rewards] == [round(p["reward"], 4) for p in r.progress]
    assert "train/loss" in events.Tags()["scalars"], events.Tags()


def test_wandb_offline_keeps_the_run_on_the_output_volume_and_calls_nobody(tiny_config, tmp_path):
    uid = "6f1c2a9e-0d4b-4c55-9a7e-3b2d1c0e9f88"
    cfg = tiny_config(training_kw={"report_to": ["wandb"], "max_steps": 2, "save_steps": 2},
                      job={"name": "test", "namespace": "default", "uid": uid})
    with socket.socket() as trap:  # wandb's server and any proxy point here: a connection would queue on it
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.setblocking(False)
        url = f"http://127.0.0.1:{trap.getsockname()[1]}"
        r = run(trainer_cmd(cfg), timeout=180, WANDB_MODE="offline", WANDB_BASE_URL=url, HTTPS_PROXY=url,
                HTTP_PROXY=url, WANDB_API_KEY="", HOME=tmp_path)
        assert r.returncode == 0, r
        with pytest.raises(BlockingIOError):
            trap.accept()
    runs = list((tmp_path / "out" / "wandb").glob(f"offline-run-*-{uid}"))
    assert len(runs) == 1 and (runs[0] / f"run-{uid}.wandb").stat().st_size > 0, \
        sorted(str(p) for p in (tmp_path / "out").rglob("*wandb*"))


def test_trackio_keeps_its_run_on_the_output_volume_and_calls_nobody(tiny_config, tmp_path):
    import sqlite3

    cfg = tiny_config(training_kw={"report_to": ["trackio"], "max_steps": 2, "save_steps": 2},
                      job={"name": "tk", "namespace": "default", "uid": "0c5d8a3e-1f2b-4c6d-8e9f-a0b1c2d3e4f5"})
    with socket.socket() as trap:  # the Hub (a Space would be made there) and any proxy point here
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.setblocking(False)
        url = f"http://127.0.0.1:{trap.getsockname()[1]}"
        r = run(trainer_cmd(cfg), timeout=180, HF_ENDPOINT=url, HTTPS_PROXY=url, HTTP_PROXY=url, HOME=tmp_path)
        assert r.returncode == 0, r
        with pytest.raises(BlockingIOError):
            trap.accept()
    dbs = list((tmp_path / "out" / "trackio").rglob("*.db"))
    assert dbs, sorted(str(p) for p in (tmp_path / "out").rglob("*"))
    with sqlite3.connect(dbs[0]) as db:  # the run is named after the job and holds a row per logged step
        tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "metrics" in tables, tables
        runs = {n for (n,) in db.execute("SELECT DISTINCT run_name FROM metrics")}
        steps = db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
    assert runs == {"tk"} and steps >= 2, (runs, steps)
