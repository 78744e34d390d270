"""The trainer imports only what the job uses (issue: fast starts): TRL's trainer module imports vLLM, wandb and
trackio whenever they are installed — vLLM alone was ~5 of 12 s of a cold start for a job with vllm.mode none — so
the trainer hides the ones the job does not use before it imports TRL (grpo_trainer/lean_imports.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_trainer import lean_imports

ROOT = Path(__file__).resolve().parents[3]

# What a vllm.mode none job without trackers loads before its first step, in the order train.run() imports it.
# The module count is the budget: a deterministic stand-in for start-up time (the machines are too noisy to time).
MODULE_BUDGET = 4200  # 3,699 measured with the hide (6,251 without it), 2026-12-03
PROBE = """
import sys
from grpo_trainer import lean_imports, train
lean_imports.hide(lean_imports.unused(False, []))
from trl import GRPOTrainer
from transformers import is_trackio_available, is_wandb_available
from trl.import_utils import is_vllm_available
loaded = [m for m, v in sys.modules.items() if v is not None]
print("OPTIONAL", sorted({m.split('.')[0] for m in loaded} & {"vllm", "wandb", "trackio"}))
print("TRL_SEES", is_vllm_available(), is_wandb_available(), is_trackio_available())
print("MODULES", len(loaded))
"""


@pytest.mark.parametrize("use_vllm, report_to, hidden", [
    (False, [], ("vllm", "wandb", "trackio")),
    (False, None, ("vllm", "wandb", "trackio")),
    (True, [], ("wandb", "trackio")),
    (False, ["tensorboard"], ("vllm", "wandb", "trackio")),
    (False, ["wandb"], ("vllm", "trackio")),
    (True, ["wandb", "trackio", "tensorboard"], ()),
])
def test_only_the_packages_the_job_does_not_use_are_hidden(use_vllm: bool, report_to: list[str] | None,
                                                           hidden: tuple[str, ...]) -> None:
    assert lean_imports.unused(use_vllm, report_to) == hidden


def test_a_package_already_imported_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reward function imported before TRL that uses a package keeps it (the hide is for packages not yet loaded)."""
    monkeypatch.delitem(sys.modules, "not_yet_loaded_pkg", raising=False)
    assert lean_imports.hide(["os", "not_yet_loaded_pkg"]) == ["not_yet_loaded_pkg"]
    assert sys.modules["os"] is os and sys.modules["not_yet_loaded_pkg"] is None
    with pytest.raises(ImportError):
        import not_yet_loaded_pkg  # type: ignore[import-not-found]  # noqa: F401
    monkeypatch.delitem(sys.modules, "not_yet_loaded_pkg")


@pytest.mark.timeout(300)
def test_a_job_without_vllm_or_trackers_starts_without_loading_them() -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'trainer_image'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cp = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=280)
    assert cp.returncode == 0, cp.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in cp.stdout.splitlines() if " " in line)
    assert out["OPTIONAL"] == "[]", cp.stdout
    assert out["TRL_SEES"] == "False False False", cp.stdout  # TRL's own checks skip them at run time too
    assert int(out["MODULES"]) <= MODULE_BUDGET, (
        f"the trainer's start now loads {out['MODULES']} modules (budget {MODULE_BUDGET}): start-up grew; find the "
        "new import with `python -X importtime` and make it lazy, or raise the budget with the reason")
