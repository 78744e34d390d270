"""controller/ha.py relist: on taking the Lease the gate admits events, every page of GRPOJobs is listed, a job deleted
while the list was in flight is left out (its DELETED event was admitted meanwhile), and the items carry their kind;
Controller.start_leading caches them."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from grpo_operator.controller import ha, handlers
from grpo_operator.controller.settings import Settings


class Kube:
    def __init__(self, gate: ha.Gate) -> None:
        self.gate = gate
        self.paths: list[tuple[str, Optional[str]]] = []

    async def request(self, method: str, path: str, params: Optional[dict[str, str]] = None) -> dict[str, Any]:
        token = (params or {}).get("continue")
        self.paths.append((path, token))
        if token is None:  # first page; meanwhile job "b" is deleted and its event admitted
            assert ha.admit_event(self.gate, {"type": "DELETED"}, {"metadata": {"uid": "ub"}})
            return {"items": [item("a"), item("b")], "metadata": {"continue": "t1"}}
        return {"items": [item("c")], "metadata": {}}


def item(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u{name}", "resourceVersion": "1"}}


@pytest.mark.asyncio
async def test_relist_admits_events_lists_every_page_and_leaves_out_jobs_deleted_meanwhile() -> None:
    cfg = Settings(namespaces=["ns"], leader_elect=True)
    gate = ha.Gate(cfg.leader_elect)
    assert not gate.active and not ha.admit_event(gate, {"type": "ADDED"}, item("a"))  # a standby drops events
    k = Kube(gate)
    items = await ha.relist(gate, k, cfg)  # type: ignore[arg-type]
    assert [i["metadata"]["name"] for i in items] == ["a", "c"]
    assert all(i["kind"] == "GRPOJob" and i["apiVersion"] == "grpo.dev/v1alpha1" for i in items)
    assert [t for _, t in k.paths] == [None, "t1"] and k.paths[0][0].endswith("/namespaces/ns/grpojobs")
    assert gate.active and not gate.relisting and not gate.deleted_meanwhile


@pytest.mark.asyncio
async def test_start_leading_caches_the_relisted_jobs_and_kicks_them() -> None:
    c = handlers.Controller(Settings(namespaces=["ns"], leader_elect=True))
    c.writer.kube = Kube(c.writer.gate)  # type: ignore[assignment]
    started: list[str] = []
    c.ensure_background = lambda: started.append("background")  # type: ignore[method-assign]
    c.kick_all = lambda: started.append("kick all")  # type: ignore[method-assign]
    await c.start_leading()
    assert sorted(c.observers.jobs) == [("ns", "a"), ("ns", "c")] and c.observers.jobs[("ns", "a")]["kind"] == "GRPOJob"
    assert started == ["background", "kick all"]
