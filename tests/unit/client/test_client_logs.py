"""The log follower over a scripted fake cluster: it re-attaches to the new attempt's pod after a gang restart
(same pod name, attempt + 1), re-opens a dropped stream without repeating lines, stops when the job ends, and says
why there is nothing to read. A control plane has no kubelet, so real pod logs are tested in the real-node tier
(tests/support/client_logs.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any, Optional

import pytest

from grpo_operator.client import Job, LogsUnavailable, NodePod
from grpo_operator.client import logs as follower


def ts(second: int, frac: str = "") -> str:
    return f"2030-01-01T00:00:{second:02d}{'.' + frac if frac else ''}Z"


class FakeCluster:
    """A job and its pods; each pod name maps to its current incarnation and its log lines. The scenario moves on
    one step whenever the follower waits or a followed stream ends (as the real ones do when something changes)."""

    def __init__(self, b: Any, status: dict[str, Any], nodes: int = 2):
        self.b, self.status, self.nodes = b, status, nodes
        self.pods: dict[str, tuple[dict[str, Any], list[tuple[str, str]]]] = {}
        self.steps: list[Callable[[], None]] = []
        self.reads: list[dict[str, Any]] = []
        self.deleted = False
        self.idle = 0

    def put(self, rank: int, attempt: int, phase: str, lines: Optional[list[tuple[str, str]]] = None, **kw: Any) -> None:
        body = self.b.pod(rank, attempt, phase, started=phase != "Pending", **kw)
        self.pods[body["metadata"]["name"]] = (body, list(lines or []))

    # --- LogSource
    def job(self) -> Optional[Job]:
        if self.deleted:
            return None
        return Job.from_dict(self.b.job(copy.deepcopy(self.status), nodes=self.nodes),
                             [copy.deepcopy(b) for b, _ in self.pods.values()])

    def read(self, pod: NodePod, *, follow: bool, tail_lines: Optional[int],
             since_seconds: Optional[int]) -> Iterator[tuple[Optional[str], str]]:
        self.reads.append({"pod": pod.name, "attempt": pod.attempt, "follow": follow, "tail": tail_lines,
                           "since": since_seconds})
        _, lines = self.pods[pod.name]
        yield from (lines[-tail_lines:] if tail_lines else lines)
        if follow:
            self.advance()

    def wait(self, timeout: float) -> None:
        self.advance()

    def advance(self) -> None:
        if self.steps:
            self.steps.pop(0)()
        else:
            self.idle += 1
            assert self.idle < 5, "the follower keeps waiting on a job that will not change"


def texts(lines: list[Any]) -> list[str]:
    return [x.text for x in lines if x.kind == "log"]


def test_follow_reattaches_to_the_new_attempt_after_a_gang_restart(b: Any) -> None:
    c = FakeCluster(b, {"phase": "Running", "restarts": 0, "conditions": [b.cond("Running")]})
    c.put(0, 0, "Running", [(ts(1), "a0 step 1"), (ts(2), "a0 step 2")])
    c.put(1, 0, "Running", [(ts(1), "rank 1")])

    def killed() -> None:  # rank 1 is OOM-killed; the operator decides a gang restart
        c.put(1, 0, "Failed", exit_code=137)
        c.put(0, 0, "Failed", [(ts(1), "a0 step 1"), (ts(2), "a0 step 2")], exit_code=143)
        c.status = {"phase": "Restarting", "restarts": 1, "conditions": [b.cond("Restarting")]}

    def recreated() -> None:  # old pods gone, the new attempt's pods created under the same names, not started
        c.put(0, 1, "Pending")
        c.put(1, 1, "Pending")
        c.status = {"phase": "Pending", "restarts": 1, "conditions": [b.cond("Restarting", "False")]}

    def running() -> None:
        c.put(0, 1, "Running", [(ts(30), "a1 resumed from checkpoint-2"), (ts(31), "a1 step 3")])
        c.status = {"phase": "Running", "restarts": 1, "conditions": [b.cond("Running")]}

    def done() -> None:
        c.put(0, 1, "Succeeded", [(ts(30), "a1 resumed from checkpoint-2"), (ts(31), "a1 step 3")], exit_code=0)
        c.status = {"phase": "Succeeded", "restarts": 1, "conditions": [b.cond("Succeeded")]}

    c.steps = [killed, recreated, running, done]
    out = list(follower.follow(c, "train", 0, tail_lines=1, poll=0))
    assert texts(out) == ["a0 step 2", "a1 resumed from checkpoint-2", "a1 step 3"]
    assert [(x.kind, x.attempt) for x in out if x.kind == "attach"] == [("attach", 0), ("attach", 1)]
    assert {x.attempt for x in out if x.text.startswith("a1")} == {1} and {x.pod for x in out} == {"train-node-0"}
    # --tail applies to the first pod; the new attempt is read from its first line
    assert [(r["attempt"], r["tail"]) for r in c.reads] == [(0, 1), (1, None)]
    assert not c.steps  # it followed to the very end


def test_an_explicit_attempt_is_followed_to_its_end_only(b: Any) -> None:
    c = FakeCluster(b, {"phase": "Running", "restarts": 0})
    c.put(0, 0, "Running", [(ts(1), "a0")])

    def restart() -> None:
        c.put(0, 0, "Failed", [(ts(1), "a0")], exit_code=143)
        c.status = {"phase": "Restarting", "restarts": 1}

    c.steps = [restart, lambda: c.put(0, 1, "Running", [(ts(9), "a1")])]
    out = list(follower.follow(c, "train", 0, attempt=0, poll=0))
    assert texts(out) == ["a0"]


def test_a_dropped_stream_is_reopened_from_the_last_line_without_repeats(b: Any) -> None:
    c = FakeCluster(b, {"phase": "Running", "restarts": 0})
    c.put(0, 0, "Running", [(ts(1, "5"), "one"), (ts(1, "50001"), "two")])

    def more() -> None:  # the stream dropped (pod still Running); meanwhile a line was written
        c.pods["train-node-0"][1].append((ts(3), "three"))

    def finish() -> None:
        body, lines = c.pods["train-node-0"]
        c.put(0, 0, "Succeeded", lines, exit_code=0)
        c.status = {"phase": "Succeeded", "restarts": 0}

    c.steps = [more, finish]
    out = list(follower.follow(c, "train", 0, poll=0, clock=lambda: 1893456000.0 + 10))  # 10 s after ts(0)
    assert texts(out) == ["one", "two", "three"]
    assert len([x for x in out if x.kind == "attach"]) == 1
    assert c.reads[1]["since"] == 10  # ceil(10 - 1.50001) + 1: reaches back past the last line seen


def test_follow_waits_for_a_gated_pod_then_reads_it(b: Any) -> None:
    c = FakeCluster(b, {"phase": "Pending", "restarts": 0})
    c.put(0, 0, "Pending", gated=True)

    def admitted() -> None:
        c.put(0, 0, "Running", [(ts(5), "hello")])
        c.status = {"phase": "Running"}

    def finished() -> None:
        c.put(0, 0, "Succeeded", [(ts(5), "hello")], exit_code=0)
        c.status = {"phase": "Succeeded"}

    c.steps = [admitted, finished]
    assert texts(list(follower.follow(c, "train", 0, poll=0))) == ["hello"]


def test_follow_ends_when_the_job_is_deleted(b: Any) -> None:
    c = FakeCluster(b, {"phase": "Pending"})
    c.put(0, 0, "Pending")
    c.steps = [lambda: setattr(c, "deleted", True)]
    assert list(follower.follow(c, "train", 0, poll=0)) == []


def test_nothing_to_read_is_explained(b: Any) -> None:
    c = FakeCluster(b, {"phase": "Pending", "restarts": 0})
    c.put(0, 0, "Pending", gated=True)
    with pytest.raises(LogsUnavailable, match="kueue.x-k8s.io/admission"):
        list(follower.read_once(c, "train", 0, None, None, None))
    with pytest.raises(LogsUnavailable, match="node ranks 0..1, not 5"):
        list(follower.read_once(c, "train", 5, None, None, None))
    with pytest.raises(LogsUnavailable, match="node ranks 0..1, not 7"):
        list(follower.follow(c, "train", 7, poll=0))
    c = FakeCluster(b, {"phase": "Running", "restarts": 2})
    c.put(0, 2, "Running", [(ts(1), "x")])
    with pytest.raises(LogsUnavailable, match="no pod of attempt 0 any more.*attempts present: 2"):
        list(follower.read_once(c, "train", 0, 0, None, None))
    assert texts(list(follower.read_once(c, "train", 0, None, 5, None))) == ["x"]
    assert c.reads[-1] == {"pod": "train-node-0", "attempt": 2, "follow": False, "tail": 5, "since": None}
    # a finished job whose pod never ran: an error, not silence
    c = FakeCluster(b, {"phase": "Failed", "restarts": 0, "message": "unschedulable for too long"})
    c.put(0, 0, "Pending")
    with pytest.raises(LogsUnavailable, match="train-node-0"):
        list(follower.follow(c, "train", 0, poll=0))


def test_timestamp_order_survives_trimmed_nanoseconds() -> None:
    assert follower.ts_key(ts(0, "1")) > follower.ts_key(ts(0, "09"))
    assert follower.ts_key(ts(0, "5")) == follower.ts_key(ts(0, "500000000"))
    assert follower.ts_key(ts(1)) > follower.ts_key(ts(0, "999999999"))
