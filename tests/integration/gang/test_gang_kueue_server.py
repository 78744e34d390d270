"""A server-mode job under Kueue on the real control plane (the real operator and API server; Kueue's webhook
finalizer, its finalizer-removal rule and its admission of whole groups played by the test, as in
test_gang_cluster.py): the vLLM server is a pod group of its own, admitted and Ready before the trainers' group is
created; a trainer's exit 137 refills the trainers' group and keeps the server pod (same uid) after the engine probe;
the server's failure replaces both, server first; deleting the job ends both groups, so every pod goes. A server in
the trainers' group would never be admitted here: its group would wait for trainers that wait for it."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_operator.api import gang as g
from tests.integration.gang.test_gang_cluster import KueueAndNode, _live, _status, job_body
from tests.support.fake_vllm import FakeVllm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def groups(pods: list[dict[str, Any]]) -> dict[str, tuple[str, str, str]]:
    """pod → (group, total count, uid)."""
    return {p["metadata"]["name"]: (p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL],
                                    p["metadata"]["annotations"][g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION],
                                    p["metadata"]["uid"]) for p in pods}


def live(k: Any, ns: str, job: str) -> dict[str, tuple[str, str, str]]:
    return groups([p for p in _live(k, ns, job) if not p["metadata"].get("deletionTimestamp")])


def test_kueue_server_first_in_its_own_group_kept_across_a_trainer_restart(operator_process: Any, controlplane: Any,
                                                                          kubectl: Any, k8s_namespace: str) -> None:
    k, ns = kubectl, k8s_namespace
    with FakeVllm("ok") as engine:
        body = job_body("ks", ns, vllm={"mode": "server", "server": {"port": engine.port}})
        body["metadata"]["labels"] = {g.KUEUE_QUEUE_LABEL: "lq"}
        k.apply(body)
        sim = KueueAndNode(controlplane, ns, whole_groups=True)

        # 1. the server alone, in a group of its own (total 1), admitted and Ready; then the trainers' group
        sim.run_until(lambda: _status(k, ns, "ks").get("phase") == "Running", 90, "attempt 0 running")
        first = live(k, ns, "ks")
        server_group, total, server_uid = first["ks-vllm-0"]
        trainer_group = first["ks-node-0"][0]
        assert total == "1" and server_group != trainer_group and server_group.endswith("-vllm-a0")
        assert {n: v[:2] for n, v in first.items() if n != "ks-vllm-0"} == {
            "ks-node-0": (trainer_group, "2"), "ks-node-1": (trainer_group, "2")}
        # the server appeared alone; the trainers in a later step, after it ran and was Ready
        assert sim.seen[0] == [("ks-vllm-0", "Pending")], sim.seen[:3]
        later = [names for names in sim.seen[1:] if any(n.startswith("ks-node") for n, _ in names)][0]
        assert ("ks-vllm-0", "Running") in later, sim.seen[:4]

        # 2. a trainer exits 137: the trainers' group is refilled with attempt 1's trainers; the server stays
        sim.end("ks-node-0", 137)
        sim.run_until(lambda: (_status(k, ns, "ks").get("restarts") == 1
                               and _status(k, ns, "ks").get("phase") == "Running"), 90, "attempt 1 running")
        now = live(k, ns, "ks")
        assert sorted(now) == ["ks-node-0-a1", "ks-node-1-a1", "ks-vllm-0"]
        assert now["ks-vllm-0"] == (server_group, "1", server_uid)  # the same server pod, in its own group
        assert {v[0] for n, v in now.items() if n != "ks-vllm-0"} == {trainer_group}  # replacements, same group
        assert _status(k, ns, "ks").get("vllmServerAttempt") == 0 and engine.requests >= 1
        assert sorted(sim.finalized) == ["ks-node-0", "ks-node-1"] and sim.excess == []

        # 3. the server fails: both are replaced, the server first (its group), then the trainers (theirs)
        sim.end("ks-vllm-0", 1)
        sim.run_until(lambda: (_status(k, ns, "ks").get("restarts") == 2
                               and _status(k, ns, "ks").get("phase") == "Running"), 90, "attempt 2 running")
        now = live(k, ns, "ks")
        assert sorted(now) == ["ks-node-0-a2", "ks-node-1-a2", "ks-vllm-0-a2"]
        assert now["ks-vllm-0-a2"][:2] == (server_group, "1") and now["ks-vllm-0-a2"][2] != server_uid
        assert {v[0] for n, v in now.items() if n != "ks-vllm-0-a2"} == {trainer_group}
        assert "vllmServerAttempt" not in _status(k, ns, "ks") and sim.excess == []

    # 4. deleting the job ends both groups: Kueue lets every pod go
    k("delete", "grpojob", "ks", "-n", ns, "--wait=false")
    sim.run_until(lambda: not _live(k, ns, "ks"), 60, "the deleted job's pods finalized and gone")
    assert sim.excess == []
