"""The trainer's final progress record, written where the kubelet picks up a termination message."""

import json

from grpo_trainer import progress


def test_final_record_is_small_and_complete(tmp_path, monkeypatch):
    path = tmp_path / "termination-log"
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(path))
    last = {"step": 5, "reward": 0.5, "rewardStd": 0.1, "kl": None, "rewards": {"accuracy": 0.5, "length": 0.2},
            "loss": 0.0, "elapsed": 3.0}
    progress.write_final_progress(last, 6, 6)
    text = path.read_text()
    assert text.startswith("GRPO_RESULT ") and len(text) < 1024
    rec = json.loads(text[len("GRPO_RESULT "):])
    assert rec == {"step": 6, "maxSteps": 6, "reward": 0.5, "rewardStd": 0.1,
                   "rewards": {"accuracy": 0.5, "length": 0.2}}
    huge = {"rewards": {f"reward_function_number_{i}": 0.123456789 for i in range(40)}}
    assert "rewards" not in progress.final_record(huge, 1, 2)
