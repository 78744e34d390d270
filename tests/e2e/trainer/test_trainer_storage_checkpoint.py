"""Two failures a real node showed (docs/real-node.md), each with its own permanent exit code and one
clear line instead of "internal error (exit 1)":
- an output volume the trainer's user cannot write (a hostPath PV ignores fsGroup): storage error, exit 16, before
  anything is loaded;
- a checkpoint that exists but cannot be loaded, whatever the exception says: checkpoint error, exit 15.
(Resuming itself under torchrun on CPU with the locked transformers 5.17 is test_trainer_resume_runs.py's.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.trainer import config_doc, run, trainer_cmd

pytestmark = pytest.mark.slow

UID = 1000  # the trainer image's user


def test_output_volume_not_writable_by_the_trainer_is_a_storage_error():
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: cannot run the trainer as an unprivileged user")
    root = Path(tempfile.mkdtemp(prefix="grpo-storage-"))
    try:
        root.chmod(0o755)
        volume = root / "volume"  # like a hostPath PV: owned by root, mode 755, the pod's fsGroup not applied
        volume.mkdir(mode=0o755)
        home = root / "home"
        home.mkdir()
        home.chmod(0o777)
        cfg = root / "config.json"
        cfg.write_text(json.dumps(config_doc(volume / "job")))
        cfg.chmod(0o644)
        cmd = trainer_cmd(cfg)
        if os.geteuid() == 0:
            cmd = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *cmd]
        else:
            volume.chmod(0o555)
        r = run(cmd, timeout=120, HOME=str(home), TMPDIR=str(home))
        uid, gid = (UID, UID) if os.geteuid() == 0 else (os.getuid(), os.getgid())
        assert r.returncode == 16, r
        assert r.error_lines() == [
            f"grpo_trainer: storage error (exit 16): cannot write {volume / 'job'}: Permission denied; make it writable "
            f"by the trainer (uid {uid}, gid {gid}): a volume whose driver applies the pod's fsGroup, or chown/chmod "
            "the hostPath or NFS export to that group"], r
        assert "Traceback" not in r.stderr and "Loading weights" not in r.stderr, r
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_checkpoint_that_cannot_be_loaded_is_a_checkpoint_error(tmp_path):
    out = tmp_path / "out"
    first = tmp_path / "first.json"
    first.write_text(json.dumps(config_doc(out, training_kw={"max_steps": 2, "save_steps": 2})))
    r = run(trainer_cmd(first), timeout=240)
    assert r.returncode == 0 and (out / "checkpoint-2" / "optimizer.pt").exists(), r
    # A complete checkpoint (trainer_state.json, weights) whose optimizer state is damaged (a torn write on a
    # network volume): torch.load's own error says nothing about checkpoints.
    (out / "checkpoint-2" / "optimizer.pt").write_bytes(b"\x00not a torch file" * 64)
    more = tmp_path / "more.json"
    more.write_text(json.dumps(config_doc(out, training_kw={"max_steps": 4, "save_steps": 2})))
    r = run(trainer_cmd(more), timeout=240)
    assert r.returncode == 15, r
    lines = r.error_lines()
    assert lines[-1].startswith(f"grpo_trainer: checkpoint error (exit 15): cannot resume from {out / 'checkpoint-2'}: "), r
    assert lines[-1].endswith("delete that checkpoint directory to resume from an earlier one"), r
