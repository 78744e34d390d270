"""The training history a resumed trainer re-prints (GRPO_HISTORY lines from the checkpoint's trainer_state.json, each
step with the attempt that logged it), and that `kubectl grpo plot`'s parser reads them back as that attempt's."""

from __future__ import annotations

import io
import json
import types

from grpo_operator.client import history
from grpo_trainer import progress

ENTRY = {"step": 2, "loss": 0.0, "reward": 0.5, "reward_std": 0.1, "kl": 0.02, "completions/mean_length": 12.0,
         "rewards/accuracy/mean": 0.25, "rewards/accuracy/std": 0.1, "rewards/format/mean": float("nan"),
         "learning_rate": 1e-5, "epoch": 0.5}


def state(step: int, log_history: list) -> types.SimpleNamespace:
    return types.SimpleNamespace(global_step=step, max_steps=10, log_history=log_history, is_world_process_zero=True,
                                 num_input_tokens_seen=0)


def test_each_logged_step_is_stamped_with_the_attempt(monkeypatch) -> None:
    monkeypatch.setenv("GRPO_ATTEMPT", "3")
    entry = dict(ENTRY)
    st = state(2, [{"step": 1, "loss": 0.1}, entry])
    cb = progress.ProgressCallback(io.StringIO())
    cb.on_train_begin(None, st, None)
    cb.on_log(None, st, None, logs=dict(ENTRY))
    assert entry[progress.ATTEMPT_KEY] == 3 and progress.ATTEMPT_KEY not in st.log_history[0]
    st.log_history.append({"step": 3, "train_runtime": 1.0})  # the final summary is not a step: left alone
    cb.on_log(None, state(3, st.log_history), None, logs={"train_runtime": 1.0})
    assert progress.ATTEMPT_KEY not in st.log_history[-1]


def test_no_stamp_outside_a_pod_or_for_another_step(monkeypatch) -> None:
    monkeypatch.delenv("GRPO_ATTEMPT", raising=False)
    entry = dict(ENTRY)
    progress._stamp_attempt(state(2, [entry]))
    assert progress.ATTEMPT_KEY not in entry
    monkeypatch.setenv("GRPO_ATTEMPT", "1")
    progress._stamp_attempt(state(5, [entry]))  # the last entry is of another step
    progress._stamp_attempt(state(5, []))
    assert progress.ATTEMPT_KEY not in entry


def test_history_records_from_log_history() -> None:
    log_history = [{"step": 1, "loss": 0.1, "reward": 0.2, progress.ATTEMPT_KEY: 0}, {**ENTRY, progress.ATTEMPT_KEY: 1},
                   {"step": 2, "train_runtime": 3.0}, {"step": "x", "loss": 1.0}, "junk", {"loss": 1.0}]
    records = progress.history_records(log_history)
    assert [(r["step"], r.get("attempt")) for r in records] == [(1, 0), (2, 1)]
    assert records[1]["rewards"] == {"accuracy": 0.25, "format": None}
    assert (records[1]["reward"], records[1]["kl"], records[1]["completionLength"]) == (0.5, 0.02, 12.0)


def test_replay_prints_history_lines_the_client_reads_as_earlier_attempts(tmp_path) -> None:
    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": [
        {"step": 1, "loss": 0.1, "reward": 0.2, progress.ATTEMPT_KEY: 0},
        {**ENTRY, "rewards/format/mean": 1.0},  # written by a trainer that did not stamp: attempt unknown
    ]}))
    out = io.StringIO()
    assert progress.replay_history(str(ckpt), out) == 2
    lines = out.getvalue().splitlines()
    assert all(line.startswith("GRPO_HISTORY {") for line in lines)
    samples = [history.parse_line(line, attempt=4) for line in lines]
    assert [(s.attempt, s.step, s.replayed) for s in samples if s] == [(0, 1, True), (0, 2, True)]
    assert samples[1] is not None and samples[1].rewards == {"accuracy": 0.25, "format": 1.0}


def test_replay_of_a_broken_checkpoint_prints_nothing(tmp_path) -> None:
    out = io.StringIO()
    assert progress.replay_history(str(tmp_path / "missing"), out) == 0
    (tmp_path / "trainer_state.json").write_text("{")
    assert progress.replay_history(str(tmp_path), out) == 0
    (tmp_path / "trainer_state.json").write_text("[1, 2]")
    assert progress.replay_history(str(tmp_path), out) == 0
    (tmp_path / "trainer_state.json").write_text('{"log_history": {"a": 1}}')
    assert progress.replay_history(str(tmp_path), out) == 0 and out.getvalue() == ""
