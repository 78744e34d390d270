"""Choosing the checkpoint to resume from: the highest COMPLETE checkpoint-N, incomplete ones skipped."""

import json

from grpo_trainer.resume import is_complete, latest_checkpoint


def make(root, step, *, state=True, weights=True, global_step=None, truncated=False):
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    if weights:
        (d / "model.safetensors").write_bytes(b"x")
    if state:
        text = json.dumps({"global_step": step if global_step is None else global_step})
        (d / "trainer_state.json").write_text(text[:5] if truncated else text)
    return d


def test_no_output_dir_or_no_checkpoints(tmp_path):
    assert latest_checkpoint(str(tmp_path / "missing")) is None
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert latest_checkpoint(str(tmp_path)) is None


def test_highest_step_numerically_not_lexically(tmp_path):
    for step in (2, 10, 4):
        make(tmp_path, step)
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")


def test_incomplete_checkpoints_are_skipped(tmp_path):
    make(tmp_path, 2)
    make(tmp_path, 4)
    make(tmp_path, 6, state=False)          # killed before trainer_state.json was written
    make(tmp_path, 8, truncated=True)       # killed while writing it
    make(tmp_path, 10, weights=False)       # no weights
    make(tmp_path, 12, global_step=3)       # state of another step: not this checkpoint's
    (tmp_path / "checkpoint-14").write_text("a file, not a dir")
    (tmp_path / "checkpoint-x").mkdir()
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-4")
    assert is_complete(str(tmp_path / "checkpoint-2")) and not is_complete(str(tmp_path / "checkpoint-6"))
