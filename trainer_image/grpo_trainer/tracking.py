"""Experiment tracking where people look: where TRL's `report_to` integrations write, and the identity of the run.

A GRPOJob is one tracking run across its attempts: a gang restart resumes from the checkpoint and must continue the
same run, not start a new one per attempt.
- tensorboard: event files under <outputDir>/tensorboard/attempt-<N> (the output volume; the pod's /tmp dies with
  it). One directory per attempt: TensorBoard shows each as a run of its own, so the steps an attempt redoes after a
  restart do not zig-zag through the previous attempt's line.
- wandb: run id = the job's uid and WANDB_RESUME=allow (the resumed attempt continues the run); its files under
  <outputDir> (the root filesystem is read-only).
- trackio: transformers calls trackio.init(name=run_name, resume="allow"); its local database goes under
  <outputDir>/trackio so a resumed attempt finds the run it continues.
run_name defaults to the job's name (config.py). Values the user set in spec.template.env win over all of these.
Keys (WANDB_API_KEY, HF_TOKEN for trackio Spaces) come from Secrets by secretKeyRef, never from the trainer config.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping

from .contract import ATTEMPT_ENV

TRACKERS = ("tensorboard", "wandb", "trackio")  # the report_to integrations the images ship (docs/images.md)


def environment(report_to: Iterable[str], output_dir: str, job_uid: str, env: Mapping[str, str],
                now: float | None = None) -> dict[str, str]:
    """The environment variables to set (those not already in `env`) for the integrations in `report_to`."""
    wanted = set(report_to or ())
    if "all" in wanted:  # transformers' "all": every integration installed (the images ship these three)
        wanted |= set(TRACKERS)
    attempt = env.get(ATTEMPT_ENV, "")
    out: dict[str, str] = {}
    if "tensorboard" in wanted:
        # outside a pod (grpojob run --local) there is no attempt: one directory per start
        run = f"attempt-{attempt}" if attempt.isdigit() else time.strftime("local-%Y%m%d-%H%M%S",
                                                                              time.gmtime(now))
        out["TENSORBOARD_LOGGING_DIR"] = os.path.join(output_dir, "tensorboard", run)
    if "wandb" in wanted:
        out["WANDB_DIR"] = output_dir
        if job_uid:
            out["WANDB_RUN_ID"] = job_uid
            out["WANDB_RESUME"] = "allow"
    if "trackio" in wanted:
        out["TRACKIO_DIR"] = os.path.join(output_dir, "trackio")
    return {k: v for k, v in out.items() if k not in env}


def apply(report_to: Iterable[str], output_dir: str, job_uid: str) -> dict[str, str]:
    """Set environment() in this process (before the trainer builds its callbacks); returns what was set."""
    added = environment(report_to, output_dir, job_uid, os.environ)
    os.environ.update(added)
    return added
