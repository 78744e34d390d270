"""The controller's scheduling, without an API server: kicks coalesce per job, passes across jobs are bounded
(memory: a pass holds the parsed spec and the rendered children), finished passes leave nothing behind, and the
job cache keeps no managedFields."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from grpo_operator.controller import handlers
from grpo_operator.controller.settings import Settings


def job(name: str, rv: int = 1) -> dict[str, Any]:
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
            "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": str(rv),
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"model": "m"}, "status": {"phase": "Pending"}}


@pytest.mark.asyncio
@pytest.mark.parametrize("writes", [1, 3])
async def test_passes_are_bounded_coalesced_and_forgotten(writes: int) -> None:
    c = handlers.Controller(Settings(namespaces=["ns"], max_concurrent_writes=writes))
    running, most, done = 0, 0, []
    gate = asyncio.Event()

    async def reconcile(key: handlers.Key) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await gate.wait()
        running -= 1
        done.append(key)

    c.reconcile = reconcile  # type: ignore[method-assign]
    keys = [("ns", f"j{i}") for i in range(20)]
    for k in keys:
        c.kick(k)
    await asyncio.sleep(0.05)
    assert len(c.queue.tasks) == 20 and running == 2 * writes
    for k in keys:
        c.kick(k)  # while its pass runs or waits: one more pass after it at most, never a second task
        c.kick(k)
    assert len(c.queue.tasks) == 20
    gate.set()
    for _ in range(200):
        if not c.queue.tasks:
            break
        await asyncio.sleep(0.01)
    assert most == 2 * writes
    running_first = keys[:2 * writes]  # these were inside reconcile when kicked again: each runs once more
    assert sorted(done) == sorted(keys + running_first)
    assert c.queue.tasks == {} and c.queue.dirty == set()


def test_cache_drops_managed_fields_and_older_events() -> None:
    c = handlers.Controller(Settings(namespaces=["ns"]))
    body = job("a", rv=5)
    key = c.observers.observe_job(body)
    cached = c.observers.jobs[key]
    assert "managedFields" not in cached["metadata"] and cached["spec"] == {"model": "m"}
    assert "managedFields" in body["metadata"]  # the event's own object is left as it was
    c.observers.observe_job(job("a", rv=4))  # e.g. our own write's response arriving after a newer event
    assert c.observers.jobs[key]["metadata"]["resourceVersion"] == "5"


def test_operator_process_does_not_import_the_kubernetes_client() -> None:
    code = ("import sys, grpo_operator.cli.grpo_operator, kopf; "
            "print(sorted(m for m in ('kubernetes', 'kubernetes_asyncio', 'pykube') if sys.modules.get(m)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
