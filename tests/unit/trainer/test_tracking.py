"""Experiment tracking: where each report_to integration writes (the output volume), and one run per job across
attempts (run name = the job, wandb id = its uid); the user's own environment wins."""

from __future__ import annotations

import os

from grpo_trainer import config, tracking
from tests.support.trainer import config_doc

UID = "0b1c7c9e-1f7e-4f41-9d3e-5b6c3a1d2e4f"


def test_tensorboard_writes_one_directory_per_attempt_on_the_output_volume() -> None:
    env = tracking.environment(["tensorboard"], "/ckpt/job", UID, {"GRPO_ATTEMPT": "2"})
    assert env == {"TENSORBOARD_LOGGING_DIR": "/ckpt/job/tensorboard/attempt-2"}


def test_tensorboard_outside_a_pod_gets_a_directory_per_start() -> None:
    env = tracking.environment(["tensorboard"], "runs/j", "", {}, now=0)
    assert env == {"TENSORBOARD_LOGGING_DIR": "runs/j/tensorboard/local-19700101-000000"}


def test_wandb_resumes_the_jobs_run_and_writes_to_the_output_volume() -> None:
    env = tracking.environment(["wandb"], "/ckpt/job", UID, {"GRPO_ATTEMPT": "1"})
    assert env == {"WANDB_DIR": "/ckpt/job", "WANDB_RUN_ID": UID, "WANDB_RESUME": "allow"}
    assert tracking.environment(["wandb"], "runs/j", "", {}) == {"WANDB_DIR": "runs/j"}  # local: a new run


def test_trackio_keeps_its_database_on_the_output_volume() -> None:
    assert tracking.environment(["trackio"], "/ckpt/job", UID, {}) == {"TRACKIO_DIR": "/ckpt/job/trackio"}


def test_nothing_for_integrations_not_reported_to_and_the_users_values_win() -> None:
    assert tracking.environment([], "/o", UID, {"GRPO_ATTEMPT": "0"}) == {}
    assert tracking.environment(["mlflow"], "/o", UID, {}) == {}
    mine = {"WANDB_RUN_ID": "my-run", "TENSORBOARD_LOGGING_DIR": "/elsewhere", "GRPO_ATTEMPT": "0"}
    got = tracking.environment(["wandb", "tensorboard", "trackio"], "/o", UID, mine)
    assert got == {"WANDB_DIR": "/o", "WANDB_RESUME": "allow", "TRACKIO_DIR": "/o/trackio"}


def test_apply_sets_the_process_environment(monkeypatch) -> None:
    monkeypatch.setenv("GRPO_ATTEMPT", "4")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "")  # recorded, so the value apply() sets is undone afterwards
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR")
    assert tracking.apply(["tensorboard"], "/o", UID) == {"TENSORBOARD_LOGGING_DIR": "/o/tensorboard/attempt-4"}
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == "/o/tensorboard/attempt-4"
    assert tracking.apply(["tensorboard"], "/o", UID) == {}  # already set: kept


def test_the_run_is_named_after_the_job_unless_the_spec_names_it() -> None:
    doc = config_doc("/out")
    doc["job"] = {"name": "qwen-gsm8k", "namespace": "team", "uid": UID}
    cfg = config.parse(doc)
    assert cfg.job_uid == UID
    assert config.grpo_kwargs(cfg, cuda=False)["run_name"] == "qwen-gsm8k"
    doc["training"]["run_name"] = "mine"
    assert config.grpo_kwargs(config.parse(doc), cuda=False)["run_name"] == "mine"
    doc = config_doc("/out")
    doc["job"] = {"name": "", "namespace": "", "uid": ""}
    assert config.grpo_kwargs(config.parse(doc), cuda=False)["run_name"] is None  # TRL's default


def test_all_means_every_tracker_the_images_ship() -> None:
    got = tracking.environment(["all"], "/o", UID, {"GRPO_ATTEMPT": "2"})
    assert got["TENSORBOARD_LOGGING_DIR"] == "/o/tensorboard/attempt-2" and got["WANDB_RUN_ID"] == UID
    assert got["TRACKIO_DIR"] == "/o/trackio"
