"""The operator's table of GRPOConfig fields is exactly what the pinned TRL has (regenerated, compared)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_operator import api
from grpo_operator.api import trl_fields

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the trainer extra (pip install .[trainer])")
def test_table_matches_installed_trl():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_trl_fields.py"), "--check"], timeout=300)
    assert proc.returncode == 0, "TRL drifted: run python scripts/gen_trl_fields.py and review the diff"


def test_pinned_version():
    assert trl_fields.trl_version() == "1.16.0"
    text = (ROOT / "pyproject.toml").read_text()
    assert 'trl==1.16.0' in text


def test_every_field_is_accepted_by_camel_name_with_its_type():
    for f in trl_fields.fields():
        if f.camel in trl_fields.OWNED_BY_SPEC:
            continue
        assert f.camel in api.TrainingSpec.model_fields, f.camel
    spec = api.TrainingSpec.model_validate({"learningRate": 1e-5, "bf16": True, "lrSchedulerType": "cosine",
                                            "reportTo": ["none"], "modelInitKwargs": {"torch_dtype": "bfloat16"}})
    assert api.training_kwargs(spec) == {"learning_rate": 1e-5, "bf16": True, "lr_scheduler_type": "cosine",
                                         "report_to": ["none"], "model_init_kwargs": {"torch_dtype": "bfloat16"}}


def test_suggestions():
    assert trl_fields.suggest("numGeneration") == "numGenerations"
    assert trl_fields.suggest("num_generations") == "numGenerations"
    assert trl_fields.suggest("learningrate") == "learningRate"
    assert trl_fields.suggest("zzzzzz") is None
