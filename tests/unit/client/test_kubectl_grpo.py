"""`kubectl grpo` without a cluster: flags, durations, exit codes (wait: 0 reached / 1 ended otherwise / 2 timeout),
one-line errors, output formats, the multiplexed logs of every rank, and the console script's name."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_operator.cli import kubectl_grpo as cli
from grpo_operator.client import Job, JobFailed, JobNotFound, LogLine, UnreachableStatus, WaitTimeout

REPO = Path(__file__).resolve().parents[3]


class FakeClient:
    def __init__(self, b: Any, **kw: Any):
        self.b, self.kw, self.namespace = b, kw, kw.get("namespace") or "default"
        self.calls: list[tuple[str, Any]] = []
        self.wait_outcome: Any = None
        self.lines: list[LogLine] = []

    def job(self, name: str = "train", phase: str = "Running") -> Job:
        return Job.from_dict(self.b.job({"phase": phase, "restarts": 1, "topology": "2x4",
                                         "progress": {"step": 3, "maxSteps": 10, "reward": 0.25}},
                                        name=name, creationTimestamp="2020-01-01T00:00:00Z"))

    def list_jobs(self, **kw: Any) -> list[Job]:
        self.calls.append(("list", kw))
        return [self.job("a"), self.job("b", "Pending")]

    def wait_for_job_status(self, name: str, phases: Any, timeout: float) -> Job:
        self.calls.append(("wait", (name, phases, timeout)))
        if isinstance(self.wait_outcome, Exception):
            raise self.wait_outcome
        return self.job(name, "Succeeded")

    def get_job(self, name: str) -> Job:
        raise JobNotFound(self.namespace, name)

    def follow_job_logs(self, name: str, rank: int, **kw: Any) -> Iterator[LogLine]:
        self.calls.append(("logs", (name, rank, kw)))
        yield from self.lines

    def follow_all_ranks(self, name: str, **kw: Any) -> Iterator[LogLine]:
        self.calls.append(("all", (name, kw)))
        yield from self.lines


@pytest.fixture
def fake(b: Any) -> Any:
    made: list[FakeClient] = []

    def make(**kw: Any) -> FakeClient:
        c = FakeClient(b, **kw)
        c.wait_outcome = getattr(make, "outcome", None)
        c.lines = getattr(make, "lines", [])
        made.append(c)
        return c

    make.made = made  # type: ignore[attr-defined]
    return make


def run(fake: Any, capsys: Any, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv), make_client=fake)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("500ms", 0.5),
                                          ("1.5h", 5400), ("0", 0)])
def test_durations(text: str, seconds: float) -> None:
    assert cli.duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5q", "m", "10m5", "-3s", "1h 2m", "inf", "nan"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(Exception, match="invalid duration|finite"):
        cli.duration(text)


@pytest.mark.parametrize("argv,needle", [
    (["wait", "j", "--for", "Done"], "phases are Pending, Running"),
    (["wait", "j"], "--for"),
    (["logs", "j", "--rank", "x"], "not a whole number"),
    (["logs", "j", "--tail", "-1"], "must be ≥ 0"),
    (["logs", "j", "--since", "soon"], "invalid duration"),
    (["describe", "j", "-A"], "applies to list only"),
    (["describe", "j", "-o", "wide"], "-o wide applies to list only"),
    (["logs", "j", "-o", "json"], "-o does not apply to logs"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
    (["list", "-o", "xml"], "invalid choice"),
])
def test_usage_errors_are_one_line_and_exit_1(fake: Any, capsys: Any, argv: list[str], needle: str) -> None:
    rc, out, err = run(fake, capsys, *argv)
    assert rc == 1 and out == "" and needle in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("kubectl-grpo: error: ")


def test_help_exits_0(fake: Any, capsys: Any) -> None:
    rc, out, _ = run(fake, capsys, "-h")
    assert rc == 0 and "kubectl grpo" in out and "exit codes" in out
    rc, out, _ = run(fake, capsys, "logs", "-h")
    assert rc == 0 and "--rank" in out and "not torch's global rank" in " ".join(out.split())


@pytest.mark.parametrize("outcome,rc", [
    (None, 0),
    (JobFailed("grpojob ns/j Failed: pod j-node-0 exited with code 2"), 1),
    (UnreachableStatus("grpojob ns/j ended Succeeded, not Running"), 1),
    (JobNotFound("ns", "j"), 1),
    (WaitTimeout("grpojob ns/j is Pending, not Running, after 5s"), 2),
])
def test_wait_exit_codes(fake: Any, capsys: Any, outcome: Any, rc: int) -> None:
    fake.outcome = outcome
    code, out, err = run(fake, capsys, "wait", "j", "--for", "Running,Succeeded", "--timeout", "5s", "-n", "ns")
    assert code == rc, (out, err)
    assert fake.made[-1].calls == [("wait", ("j", {"Running", "Succeeded"}, 5.0))]
    assert fake.made[-1].kw == {"namespace": "ns", "context": None, "config_file": None}
    if outcome is None:
        assert out.strip() == "grpojob.grpo.dev/j Succeeded"
    else:
        assert str(outcome) in err and len(err.strip().splitlines()) == 1


def test_global_flags_before_or_after_the_command(fake: Any, capsys: Any) -> None:
    run(fake, capsys, "--context", "c1", "--kubeconfig", "/k", "list", "-n", "x")
    run(fake, capsys, "-n", "y", "list", "--context", "c2")
    assert [m.kw for m in fake.made] == [{"namespace": "x", "context": "c1", "config_file": "/k"},
                                         {"namespace": "y", "context": "c2", "config_file": None}]


def test_list_formats(fake: Any, capsys: Any) -> None:
    rc, out, _ = run(fake, capsys, "list")
    rows = [ln.split() for ln in out.splitlines()]
    assert rc == 0 and rows[0] == ["NAME", "PHASE", "ATTEMPT", "NODES", "STEP", "REWARD", "AGE"]
    assert rows[1][:6] == ["a", "Running", "1", "2", "3/10", "0.250"] and re.fullmatch(r"\d+d", rows[1][6])
    rc, out, _ = run(fake, capsys, "list", "-A", "-o", "wide")
    assert out.split()[:2] == ["NAMESPACE", "NAME"] and "TOPOLOGY" in out and "2x4" in out
    rc, out, _ = run(fake, capsys, "list", "-o", "json")
    assert [(j["name"], j["phase"], j["attempt"]) for j in json.loads(out)] == [("a", "Running", 1),
                                                                              ("b", "Pending", 1)]


def test_errors_from_the_client_are_one_line(fake: Any, capsys: Any) -> None:
    rc, out, err = run(fake, capsys, "describe", "nope", "-n", "ns")
    assert rc == 1 and err.strip() == "kubectl-grpo: error: grpojob ns/nope not found"


def test_logs_of_every_rank_are_prefixed_and_restarts_noted(fake: Any, capsys: Any) -> None:
    L = LogLine
    fake.lines = [L("", 0, 0, "j-node-0", kind="attach"), L("", 1, 0, "j-node-1", kind="attach"),
                  L("step 1", 0, 0, "j-node-0", "2030-01-01T00:00:01Z"), L("hello", 1, 0, "j-node-1"),
                  L("", 0, 1, "j-node-0", kind="attach"), L("resumed", 0, 1, "j-node-0", "2030-01-01T00:01:00Z"),
                  L("rank 5: no pod", -1, -1, "", kind="error")]
    rc, out, err = run(fake, capsys, "logs", "j", "--rank", "all", "-f", "--since", "10m", "--tail", "3",
                       "--timestamps")
    assert out.splitlines() == ["[rank 0] 2030-01-01T00:00:01Z step 1", "[rank 1] hello",
                                "[rank 0] 2030-01-01T00:01:00Z resumed"]
    assert "rank 0: gang restart, now following attempt 1 (pod j-node-0)" in err and "rank 5: no pod" in err
    assert rc == 1  # a rank had nothing to read
    assert fake.made[-1].calls == [("all", ("j", {"follow": True, "tail_lines": 3, "since_seconds": 600,
                                                  "attempt": None}))]
    fake.lines = fake.lines[2:3]
    rc, out, err = run(fake, capsys, "logs", "j", "--rank", "1", "--attempt", "0")
    assert rc == 0 and out == "step 1\n" and err == ""
    assert fake.made[-1].calls == [("logs", ("j", 1, {"follow": False, "tail_lines": None, "since_seconds": None,
                                                      "attempt": 0}))]


def test_the_console_script_is_kubectl_grpo() -> None:
    """kubectl finds plugins by file name: the script must be called exactly kubectl-grpo."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-grpo"] == "grpo_operator.cli.kubectl_grpo:main"
