"""The operator↔trainer contract (grpo_trainer/contract.py) is the one both sides use: the operator classifies every
trainer exit code as the trainer means it and names it in status, renders the labels, ports and schema version the
trainer reads, and importing the contract stays light (the operator image has no torch)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_operator import lifecycle
from grpo_operator.render import manifests
from grpo_operator.rules import validation
from grpo_trainer import config as trainer_config
from grpo_trainer import contract, exitcodes
from tests.support.jobs import manifest, pod_body

REPO = Path(__file__).resolve().parents[2]
TRAINER_CODES = sorted(set(contract.PERMANENT) | set(contract.RETRYABLE))


def failed_pod(code: int) -> lifecycle.PodInfo:
    return lifecycle.summarize_pod(pod_body("job", 0, "Failed", exit_code=code))


@pytest.mark.parametrize("code", TRAINER_CODES)
def test_operator_classifies_every_trainer_exit_code_as_the_trainer_means_it(code: int) -> None:
    failure = lifecycle.classify(failed_pod(code))
    assert failure is not None
    assert failure.retryable is contract.is_retryable(code) is (code in contract.RETRYABLE)
    assert failure.reason == contract.EXIT_REASONS[code]  # by name (DatasetError), not by number


@pytest.mark.parametrize("code, retryable, reason", [
    (2, False, "ExitCode2"), (127, False, "ExitCode127"), (128, True, "ExitCode128"), (137, True, "ExitCode137"),
    (255, True, "ExitCode255"), (-9, True, "ExitCode-9"),
])
def test_codes_the_trainer_does_not_define_follow_the_rule_by_number(code: int, retryable: bool, reason: str) -> None:
    failure = lifecycle.classify(failed_pod(code))
    assert failure is not None and (failure.retryable, failure.reason) == (retryable, reason)


def test_every_exit_code_constant_is_classified_named_and_documented() -> None:
    constants = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, int)
                 and k not in ("SCHEMA_VERSION", "C10D_PORT", "METRICS_PORT", "SIGNAL_BASE", "OK")}
    assert constants == set(TRAINER_CODES) == set(contract.EXIT_REASONS)
    doc = (REPO / "docs" / "trainer.md").read_text()
    for code in TRAINER_CODES:
        assert re.search(rf"^\| {code} \|.*\| `{contract.EXIT_REASONS[code]}` \|$", doc, re.M), code
    # the trainer's own modules use the same numbers
    for name in ("CONFIG", "DATASET", "REWARD", "BATCH", "MODEL", "CHECKPOINT", "STORAGE", "PREEMPTED", "DISTRIBUTED",
                 "ACCELERATOR_OOM", "TRANSIENT_IO", "INTERNAL", "SIGNAL_BASE"):
        assert getattr(exitcodes, name) == getattr(contract, name)


def test_rendered_pods_and_config_speak_the_contract() -> None:
    res = validation.validate(manifest("job", nodes=2))
    objs = manifests.core_objects(res.job, res.topology, "ns", uid="u", attempt=3)
    pod = next(o for o in objs if o["kind"] == "Pod")
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels[contract.LABEL_ROLE] == contract.ROLE_TRAINER and labels[contract.LABEL_RANK] == "0"
    assert labels[contract.LABEL_JOB] == "job" and labels[contract.LABEL_ATTEMPT] == "3"
    assert annotations[contract.ANNOTATION_ATTEMPT] == "3" and annotations[contract.ANNOTATION_JOB] == "job"
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or []}
    assert ports[contract.METRICS_PORT_NAME] == contract.METRICS_PORT
    config = manifests.trainer_config(res.job, "ns")
    assert config["schemaVersion"] == contract.SCHEMA_VERSION == trainer_config.SCHEMA_VERSION
    # what the lifecycle reads back from such a pod
    info = lifecycle.summarize_pod(pod)
    assert (info.role, info.rank, info.attempt) == (contract.ROLE_TRAINER, 0, 3)


def test_the_contract_imports_nothing_heavy() -> None:
    code = ("import sys, grpo_trainer.contract, grpo_operator.lifecycle, grpo_operator.render.manifests; "
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'datasets', 'kopf', 'kubernetes', 'aiohttp') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
    source = (REPO / "trainer_image" / "grpo_trainer" / "contract.py").read_text()
    assert not re.findall(r"^\s*(?:from|import) (?!__future__)", source, re.M)  # the standard library at most: none
