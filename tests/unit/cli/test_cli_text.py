"""What the CLI says, read as a user reads it (issue 30 item 3): no Python reprs in any output (`None`, `{'a': 1}`,
`['x']`, a list where prose is expected: "numGenerationsEval None → 6", "Valid numGenerations: [2, 4]", "(got
None)"), over every example and an error corpus of invalid specs; "did you mean" for enum-like fields; removed TRL
arguments named as removed, with the release; stdin as `-`; plain YAML from render (the vLLM server's probes were
written as `&id001` anchors and `*id001` aliases)."""

from __future__ import annotations

import copy
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator.cli import grpojob as cli
from grpo_operator.cli import local_run

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if "GRPOJob" in p.read_text())
BASE = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())

REPR = [re.compile(p) for p in (r"\bNone\b", r"\{'", r"\['", r": \[\d", r"\bTrue\b", r"\bFalse\b",
                                r"instance of [A-Z]")]


def mutate(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    cur: Any = doc
    for key in parents:
        cur = cur[int(key)] if isinstance(cur, list) else cur.setdefault(key, {})
    if isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return doc


CORPUS = {
    "reward name typo": mutate("spec.rewards.0.name", "acuracy"),
    "vllm mode typo": mutate("spec.vllm", {"mode": "colocat"}),
    "gang typo": mutate("spec.scheduling", {"gang": "volcan"}),
    "optim typo": mutate("spec.training.optim", "adamw_torc"),
    "strategy typo": mutate("spec.parallelism", {"strategy": "zero4"}),
    "removed TRL argument": mutate("spec.training.maxPromptLength", 512),
    "unknown TRL argument": mutate("spec.training.numGeneration", 8),
    "number as text": mutate("spec.training.learningRate", "fast"),
    "eval generations unset": mutate("spec.training", {"evalStrategy": "steps", "evalSteps": 5,
                                                       "perDeviceEvalBatchSize": 3, "numGenerations": 8,
                                                       "perDeviceTrainBatchSize": 4}),
    "numGenerations 7": mutate("spec.training.numGenerations", 7),
    "generationBatchSize": mutate("spec.training.generationBatchSize", 7),
    "limits a list": mutate("spec.resources", {"limits": [1, 2]}),
    "rewards a mapping": mutate("spec.rewards", {"a": 1}),
    "model null": mutate("spec.model", None),
    "dataset null": mutate("spec.dataset", None),
    "training a list": mutate("spec.training", [1, 2]),
    "nodes text": mutate("spec.nodes", "two"),
    "nodes 0": mutate("spec.nodes", 0),
    "bool as text": mutate("spec.training.bf16", "yes"),
    "unknown field": mutate("spec.foo", {"a": 1}),
    "not a GRPOJob": {**BASE, "kind": "Job"},
}


def _no_repr(text: str, what: str) -> None:
    for pattern in REPR:
        m = pattern.search(text)
        assert m is None, f"{what}: Python repr {m.group(0)!r} in:\n{text}"


def _check(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _stdin(monkeypatch: Any, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_check_and_render_speak_plainly(path: Path, capsys: Any) -> None:
    for fmt in ("text", "json"):
        _, out, err = _check(capsys, str(path), "-o", fmt)
        _no_repr(out + err, f"check -o {fmt} {path.name}")
    code = cli.main(["render", str(path)])
    out, err = capsys.readouterr()
    _no_repr(err, f"render {path.name}")
    if code == 0:
        assert not re.search(r"[&*]id\d+", out), f"render {path.name}: YAML anchors/aliases"
        assert re.search(r"(?m)^(?!\s*clusterIP: None$).*:\s+None$", out) is None  # a headless Service's is real
        assert all(yaml.safe_load_all(out))


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_error_corpus_speaks_plainly(case: str, capsys: Any, monkeypatch: Any) -> None:
    text = yaml.safe_dump(CORPUS[case])
    for fmt in ("text", "json"):
        _stdin(monkeypatch, text)
        code, out, err = _check(capsys, "-", "-o", fmt)
        assert code in (1, 2) and "<stdin>" in out, out
        _no_repr(out + err, f"{case}: check -o {fmt}")
    _stdin(monkeypatch, text)
    assert cli.main(["render", "-"]) in (1, 2)
    _, err = capsys.readouterr()
    assert err.startswith("<stdin>: ") and all(line.startswith("<stdin>: ") for line in err.splitlines()), err
    _no_repr(err, f"{case}: render")


def _messages(case: str, capsys: Any, monkeypatch: Any) -> str:
    _stdin(monkeypatch, yaml.safe_dump(CORPUS[case]))
    _, out, _ = _check(capsys, "-", "-o", "json")
    (entry,) = json.loads(out)
    return "\n".join(f"{e['field']}: {e['message']}" for e in entry["errors"])


@pytest.mark.parametrize("case, expected", [
    ("reward name typo", "spec.rewards[0].name: \"acuracy\" is not one of accuracy, format, length; did you mean "
                         "'accuracy'?"),
    ("vllm mode typo", "did you mean 'colocate'?"),
    ("gang typo", "did you mean 'volcano'?"),
    ("optim typo", "did you mean 'adamw_torch'?"),
    ("strategy typo", "did you mean 'zero3'?"),
    ("unknown TRL argument", "did you mean 'numGenerations'?"),
    ("removed TRL argument", "'maxPromptLength' was removed from GRPOConfig in TRL 0.28.0"),
    ("eval generations unset", "set numGenerationsEval: 6"),
    ("numGenerations 7", "Valid numGenerations for this batch: 2, 4, 8, 16, 32."),
    ("model null", "spec.model: Input should be a valid string (got null)"),
    ("rewards a mapping", 'spec.rewards: Input should be a valid list (got {"a": 1})'),
])
def test_messages_name_the_fix(case: str, expected: str, capsys: Any, monkeypatch: Any) -> None:
    assert expected in _messages(case, capsys, monkeypatch)


def test_check_json_carries_warnings(capsys: Any) -> None:
    """DESIGN.md's contract: warnings as [{field, message}], the same the text output prints."""
    path = str(ROOT / "examples" / "local-tiny" / "grpojob.yaml")
    _, text, _ = _check(capsys, path)
    _, out, _ = _check(capsys, path, "-o", "json")
    (entry,) = json.loads(out)
    assert entry["warnings"] and all(set(w) == {"field", "message"} for w in entry["warnings"])
    assert entry["warnings"][0]["field"] == "spec.output.volumeClaimName"
    assert text.count("  warning: ") == len(entry["warnings"])


def test_warning_entry_splits_the_field() -> None:
    assert cli.warning_entry("spec.training.saveSteps (9) > maxSteps (5): no checkpoint") == {
        "field": "spec.training.saveSteps", "message": "spec.training.saveSteps (9) > maxSteps (5): no checkpoint"}
    assert cli.warning_entry("spec.peft.r: large") == {"field": "spec.peft.r", "message": "large"}
    assert cli.warning_entry("no field here") == {"field": "", "message": "no field here"}


def test_render_reads_stdin_and_writes_no_anchors(capsys: Any, monkeypatch: Any) -> None:
    _stdin(monkeypatch, (ROOT / "examples" / "vllm-server.yaml").read_text())
    assert cli.main(["render", "-"]) == 0
    out, _ = capsys.readouterr()
    assert "&id" not in out and "*id" not in out
    docs = list(yaml.safe_load_all(out))
    server = next(d for d in docs if d["kind"] == "Pod" and "vllm" in d["metadata"]["name"])
    container = server["spec"]["containers"][0]
    assert container.get("readinessProbe") and container.get("startupProbe")


@pytest.mark.parametrize("result, expected", [
    ({"step": 6, "maxSteps": 6, "reward": 0.5, "checkpoint": "/o/checkpoint-6"},
     "finished in 3s: 6/6 steps, final reward 0.500; model saved to /o (last checkpoint checkpoint-6)"),
    ({"step": 6, "maxSteps": 6, "reward": None, "resumedFrom": "/o/checkpoint-6", "checkpoint": "/o/checkpoint-6"},
     "nothing left to train: checkpoint-6 had already reached maxSteps 6"),
    ({"step": 6, "maxSteps": 8, "reward": None}, "6/8 steps, no reward logged"),
    ({}, "?/? steps, no reward logged"),
])
def test_run_local_summary_never_says_none(result: dict[str, Any], expected: str) -> None:
    line = local_run.summary("job", 3.2, result, "/o")
    assert expected in line and "None" not in line, line


@pytest.mark.parametrize("in_place, result, expected", [
    (1, {"step": 8, "maxSteps": 8, "reward": 0.5, "resumedFrom": "/o/checkpoint-4"},
     "8/8 steps, resumed from checkpoint-4 after 1 in-place restart, final reward 0.500"),
    (2, {"step": 8, "maxSteps": 8, "reward": 0.5, "resumedFrom": "/o/checkpoint-6"},
     "resumed from checkpoint-6 after 2 in-place restarts,"),
    (1, {"step": 8, "maxSteps": 8, "reward": 0.5}, "8/8 steps, started over after 1 in-place restart (no checkpoint yet)"),
])
def test_run_local_summary_says_how_it_restarted_in_place(in_place: int, result: dict[str, Any], expected: str) -> None:
    line = local_run.summary("job", 3.2, result, "/o", in_place)
    assert expected in line, line
