"""The capability table (rules/capabilities.py) against the CPU image's lock, which .venv installs: every row the CPU
image provides imports, every one it does not is refused (or warned) by the validator, the table knows every tracker
and optimizer transformers has, and docs/capabilities.md is generated from it."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from grpo_operator.api import trl_fields
from grpo_operator.rules import capabilities as cap
from grpo_operator.rules import validation
from tests.support.jobs import manifest

ROOT = Path(__file__).resolve().parents[3]


def _module_present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is missing (azureml.core)
        return False


def _job(need: cap.Need, gpu: bool = False, image: Any = None) -> dict[str, Any]:
    doc = manifest("j", cpu=not gpu)
    spec = doc["spec"]
    head, *rest = need.field.split(".")
    if not rest:
        spec[head] = need.example()
    else:
        node = spec.setdefault(head, {})
        for part in rest[:-1]:
            node = node.setdefault(part, {})
        node[rest[-1]] = need.example()
    spec["hfTokenSecretRef"] = {"name": "hf"}  # pushToHub warns without one
    spec.setdefault("template", {})["env"] = [{"name": "WANDB_MODE", "value": "offline"}]  # wandb refuses no key
    if image:
        spec["image"] = image
    return doc


def _flagged(res: validation.ValidationResult, need: cap.Need) -> tuple[bool, bool]:
    """(refused, warned) for the row's field."""
    where = f"spec.{need.field}"
    return any(e.field == where for e in res.errors), any(w.startswith(where + ":") for w in res.warnings)


ROWS = [pytest.param(n, id=f"{n.field}={n.example()}") for n in cap.TABLE]


@pytest.mark.parametrize("need", ROWS)
def test_every_row_on_the_cpu_image(need: cap.Need) -> None:
    """Provided on CPU: its packages import and the validator says nothing; not provided: refused (or warned, for the
    rows where the trainer carries on without a GPU)."""
    res = validation.validate(_job(need))
    refused, warned = _flagged(res, need)
    if need.provided("cpu"):
        for package in need.packages:
            importlib.import_module(str(cap.MODULES[package]))
        assert not refused and not warned, (res.errors, res.warnings)
    elif need.gpu and need.cpu_warns:
        assert warned and not refused, (res.errors, res.warnings)
    else:
        assert refused, res.warnings
        message = next(e.message for e in res.errors if e.field == f"spec.{need.field}")
        assert need.why in message and (need.fix or cap._GPU) in message, message


@pytest.mark.parametrize("need", ROWS)
def test_every_row_on_the_cuda_image(need: cap.Need) -> None:
    res = validation.validate(_job(need, gpu=True))
    refused, warned = _flagged(res, need)
    missing = [p for p in need.packages if p not in cap.IMAGE_PACKAGES["cuda"]]
    if need.provided("cuda"):
        assert not refused and not warned, (res.errors, res.warnings)
    elif all(p in cap.PLANNED["cuda"] for p in missing):
        assert warned and not refused, (res.errors, res.warnings)
    else:
        assert refused, res.warnings
    if any(cap.MODULES[p] for p in missing):  # an image of the user's own may install it: a warning only
        refused, warned = _flagged(validation.validate(_job(need, True, "my.registry/my-trainer:1")), need)
        assert warned and not refused


@pytest.mark.parametrize("package", sorted(p for p, m in cap.MODULES.items() if m))
def test_the_table_says_what_the_cpu_lock_installs(package: str) -> None:
    """A package added to (or removed from) the lock without the table following fails here."""
    present = _module_present(str(cap.MODULES[package]))
    assert present == (package in cap.IMAGE_PACKAGES["cpu"]), \
        f"{package}: installed={present}; update IMAGE_PACKAGES in rules/capabilities.py and regenerate the docs"


def test_planned_packages_are_not_in_the_locks_yet() -> None:
    """Once a lock names a planned package, it moves into IMAGE_PACKAGES (and the specs needing it are admitted)."""
    for variant, packages in cap.PLANNED.items():
        lock = "".join((ROOT / "trainer_image" / f).read_text().lower()
                       for f in ("requirements.txt", f"requirements-{variant}.txt"))
        for package in packages:
            assert f"\n{package}==" not in lock, f"{package} is in the {variant} lock: move it into IMAGE_PACKAGES"
    assert cap.IMAGE_PACKAGES["cpu"] <= cap.IMAGE_PACKAGES["cuda"]


def test_every_tracker_and_optimizer_transformers_knows_is_in_the_table() -> None:
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    reports = {v for n in cap.TABLE if n.field == "training.reportTo" for v in n.values}
    assert set(INTEGRATION_TO_CALLBACK) <= reports
    plain = {"adamw_torch", "adamw_torch_fused", "adafactor", "adagrad", "rmsprop", "sgd"}  # torch itself
    rows = [n for n in cap.TABLE if n.field == "training.optim"]
    choices = trl_fields.by_camel()["optim"].choices or ()
    uncovered = [c for c in choices if c not in plain and not any(cap.matched(n, c) for n in rows)]
    assert not uncovered and not [c for c in plain if any(cap.matched(n, c) for n in rows)]


def test_lists_custom_images_and_the_cpu_image_on_gpus() -> None:
    doc = manifest("j")
    doc["spec"]["training"]["reportTo"] = ["none", "mlflow"]
    res = validation.validate(doc)
    assert [e.field for e in res.errors] == ["spec.training.reportTo"] and "mlflow" in res.errors[0].message
    doc["spec"]["training"]["reportTo"] = ["all"]  # every tracker the image installs: tensorboard, wandb, trackio
    doc["spec"]["template"] = {"env": [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "w", "key": "k"}}}]}
    doc["spec"]["image"] = "ghcr.io/grpo-operator/grpo-trainer:0.1.0-cpu"
    res = validation.validate(doc)
    assert res.valid and not any(w.startswith("spec.training.reportTo") for w in res.warnings), res.warnings
    assert any(w.startswith("spec.image:") and "CPU trainer image" in w for w in res.warnings)
    doc["spec"]["training"] = {"pushToHub": True}
    assert any("hfTokenSecretRef" in w for w in validation.validate(doc).warnings)


@pytest.mark.parametrize("report", ["wandb", ["tensorboard", "wandb"], "all", ["all"]])
def test_wandb_needs_a_key_or_offline_mode(report: Any) -> None:
    """Without WANDB_API_KEY wandb stops the trainer at start ("No API key configured"): refused for the project's
    images, warned for an image of the user's own; a secretKeyRef or WANDB_MODE is enough."""
    doc = manifest("j")  # GPU pods: the CUDA image (wandb is in both)
    doc["spec"]["training"]["reportTo"] = report
    res = validation.validate(doc)
    assert [e.field for e in res.errors] == ["spec.training.reportTo"], res.errors
    assert "WANDB_API_KEY" in res.errors[0].message and "WANDB_MODE=offline" in res.errors[0].message
    assert ("list the trackers instead of all" in res.errors[0].message) == ("all" in str(report))
    doc["spec"]["image"] = "my.registry/my-trainer:1"
    res = validation.validate(doc)
    assert res.valid and any(w.startswith("spec.training.reportTo: ") and "wandb key" in w for w in res.warnings)
    del doc["spec"]["image"]
    for env in ({"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}},
                {"name": "WANDB_MODE", "value": "offline"}):
        doc["spec"]["template"] = {"env": [env]}
        res = validation.validate(doc)
        assert res.valid and not any("wandb" in w for w in res.warnings), (res.errors, res.warnings)


def test_docs_are_generated_from_the_table() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_capabilities_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
