"""The trainer makes no network call of its own for a local data set: datasets sends a HEAD to s3.amazonaws.com (its
download count, timeout 3 s) at every load_dataset of a packaged builder (json, csv, parquet) unless
HF_UPDATE_DOWNLOAD_COUNTS is off; it ignores HF_HUB_DISABLE_TELEMETRY. Every pod made that call at its start,
`grpojob run --local` (offline) did not (docs/performance.md, "The journey")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# In a fresh interpreter (datasets reads its switches once, at import): the entrypoint's defaults (or none), then the
# trainer's own load_dataset call with datasets' HTTP session replaced by a recorder.
PROBE = """
import os, sys
from grpo_trainer.__main__ import OFFLINE_SAFE_DEFAULTS
if sys.argv[1] == "defaults":
    for key, value in OFFLINE_SAFE_DEFAULTS.items():
        os.environ.setdefault(key, value)
import datasets.load
calls = []
class Recorder:
    def head(self, url, **kw):
        calls.append(url)
datasets.load.get_session = lambda: Recorder()
from grpo_trainer import data
from grpo_trainer.config import DatasetSpec
data.load_dataset(DatasetSpec(name=sys.argv[2], split="train", prompt_column="question", answer_column="answer"))
print("HEAD", len(calls))
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode, heads", [("defaults", 0), ("none", 1)])
def test_load_dataset_sends_no_download_count_with_the_entrypoint_defaults(tmp_path: Path, mode: str,
                                                                           heads: int) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(4)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_UPDATE_DOWNLOAD_COUNTS")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), PYTHONPATH=f"{ROOT / 'trainer_image'}{os.pathsep}"
               f"{env.get('PYTHONPATH', '')}")
    cp = subprocess.run([sys.executable, "-c", PROBE, mode, str(rows)], env=env, capture_output=True, text=True,
                        timeout=170)
    assert cp.returncode == 0, cp.stderr[-3000:]
    # "none": the probe still sees datasets' call, so the switch is the right one for the locked datasets version
    assert f"HEAD {heads}" in cp.stdout.splitlines(), cp.stdout + cp.stderr[-2000:]
