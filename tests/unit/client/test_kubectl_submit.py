"""`kubectl grpo submit` before any cluster is reached (issue 26 item 7, issue 30 item 3): a spec error is said before
a kube-config error (it used to hide behind "no kube-config"), one line per field error (they used to be joined
with "; "), the validator's warnings printed as kubectl prints the API server's, stdin named <stdin>, and
--dry-run=client answering with no kube-config at all."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator.cli import kubectl_grpo as cli
from grpo_operator.cli import kubectl_text

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "local-tiny" / "grpojob.yaml"


def _submit(monkeypatch: Any, capsys: Any, *argv: str, stdin: str = "") -> tuple[int, str, str]:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    rc = cli.main(["submit", *argv])  # the real GRPOClient: no kube-config can be found
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def _two_errors(tmp_path: Path) -> str:
    doc = yaml.safe_load(TINY.read_text())
    doc["spec"]["bogusOne"], doc["spec"]["bogusTwo"] = 1, 2
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_spec_errors_come_before_the_kubeconfig_error_one_per_line(tmp_path: Path, monkeypatch: Any,
                                                                    capsys: Any) -> None:
    path = _two_errors(tmp_path)
    rc, out, err = _submit(monkeypatch, capsys, "-f", path)
    lines = err.strip().splitlines()
    assert rc == 1 and out == ""
    assert lines == [f"kubectl-grpo: error: {path}: spec.bogusOne: unknown field 'bogusOne'",
                     f"kubectl-grpo: error: {path}: spec.bogusTwo: unknown field 'bogusTwo'"], err
    assert "kube-config" not in err


def test_a_valid_spec_prints_its_warnings_then_meets_the_missing_kubeconfig(monkeypatch: Any, capsys: Any) -> None:
    rc, out, err = _submit(monkeypatch, capsys, "-f", "-", stdin=TINY.read_text())
    assert rc == 1
    warning, config = err.strip().splitlines()
    assert warning.startswith("Warning: spec.output.volumeClaimName is not set")
    assert config.startswith("kubectl-grpo: error: no kube-config")


def test_stdin_is_named_stdin(monkeypatch: Any, capsys: Any) -> None:
    doc = yaml.safe_load(TINY.read_text())
    doc["spec"]["rewards"][0]["name"] = "acuracy"
    rc, _, err = _submit(monkeypatch, capsys, "-f", "-", stdin=yaml.safe_dump(doc))
    assert rc == 1
    assert err.strip().splitlines()[-1] == ('kubectl-grpo: error: <stdin>: spec.rewards[0].name: "acuracy" is not one '
                                            "of accuracy, format, length; did you mean 'accuracy'?")


@pytest.mark.parametrize("flag", ["--dry-run=client", "--dry-run"])
def test_client_dry_run_needs_no_kubeconfig(flag: str, monkeypatch: Any, capsys: Any) -> None:
    rc, out, err = _submit(monkeypatch, capsys, "-f", str(TINY), flag)
    assert rc == 0 and out.strip() == "grpojob.grpo.dev/local-tiny valid (dry run)"
    assert "kube-config" not in err


REPR = re.compile(r"\bNone\b|\{'|\['")


@pytest.mark.parametrize("status", [
    None,  # the operator has not looked at the job yet
    {},
    {"phase": "Pending", "restarts": 0},
    {"phase": "Running", "restarts": 1, "topology": "2x4", "progress": {"step": 3}},
    {"phase": "Running", "progress": {"step": 3, "maxSteps": 10, "reward": None, "kl": None}},
    {"phase": "Failed", "message": "pod train-node-1 exited with code 137", "lastFailureReason": "ExitCode137",
     "conditions": [{"type": "Failed", "status": "True"}], "progress": {"step": 9, "maxSteps": 10, "reward": 0.5}},
])
def test_describe_and_list_of_fixture_jobs_speak_plainly(b: Any, status: Any) -> None:
    """`kubectl grpo describe` and `list` of jobs with missing, partial and full statuses, pods and events."""
    from grpo_operator.client import Event, Job

    pods = [b.pod(0, 0, "Running", started=True), b.pod(1, 0, "Failed", exit_code=137), b.pod(0, 1)]
    job = Job.from_dict(b.job(status), pods)
    events = [Event.from_dict({"type": "Warning", "reason": "Restarting", "message": "gang restart",
                               "involvedObject": {"kind": "GRPOJob", "name": "train"}}),
              Event.from_dict({})]
    text = kubectl_text.describe_text(job, events) + "\n" + kubectl_text.list_table([job], True, True)
    assert REPR.search(text) is None, text
