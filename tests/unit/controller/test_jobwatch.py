"""The GRPOJob watch (controller/jobwatch.py) and the controller's entry point for its events: what a list, a re-list and
watch events become (ADDED / MODIFIED / DELETED with the last body), and what a standby and a leader do with them. The
real API server tests cover it end to end (test_operator_cluster.py, test_operator_ha.py, test_operator_kmock.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Optional

import pytest

from grpo_operator.controller import handlers, jobwatch, kube
from grpo_operator.controller.settings import Settings

BASE = "/apis/grpo.dev/v1alpha1"


def job(name: str, ns: str = "ns", rv: int = 1, uid: Optional[str] = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "uid": uid or f"u-{name}", "resourceVersion": str(rv),
                         "managedFields": [{"manager": "kubectl"}]}, "spec": {"x": rv}}


class FakeClient:
    def __init__(self, pages: list[list[dict[str, Any]]], events: Optional[list[dict[str, Any]]] = None):
        self.pages, self.events, self.calls = pages, list(events or []), []  # type: ignore[var-annotated]

    async def request(self, method: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((path, dict(params)))
        i = len(self.calls) - 1
        more = {"continue": f"c{i + 1}"} if i + 1 < len(self.pages) else {}
        return {"metadata": {"resourceVersion": "100", **more}, "items": self.pages[i]}

    async def watch(self, path: str, params: dict[str, Any], read_timeout: float) -> AsyncIterator[dict[str, Any]]:
        self.calls.append((path, dict(params)))
        for e in self.events:
            yield e


def make(client: Any, namespaces: Any = ("ns",)) -> tuple[jobwatch.JobWatch, list[tuple[str, dict[str, Any]]]]:
    got: list[tuple[str, dict[str, Any]]] = []
    w = jobwatch.JobWatch(lambda: client, list(namespaces) if namespaces is not None else None,
                          lambda kind, body: got.append((kind, body)))
    return w, got


def test_scopes_follow_the_operator_namespaces() -> None:
    assert jobwatch.job_scopes(None) == ([f"{BASE}/grpojobs"], None)
    assert jobwatch.job_scopes(["a", "b"])[0] == [f"{BASE}/namespaces/a/grpojobs", f"{BASE}/namespaces/b/grpojobs"]
    paths, wanted = jobwatch.job_scopes(["team-*"])  # kopf's globs: one cluster-wide watch, filtered
    assert paths == [f"{BASE}/grpojobs"] and wanted is not None and wanted("team-a") and not wanted("other")


@pytest.mark.asyncio
async def test_a_list_adds_every_page_with_its_kind_and_without_managed_fields() -> None:
    c = FakeClient([[job("a")], [job("b")]])
    w, got = make(c)
    path = f"{BASE}/namespaces/ns/grpojobs"
    assert await w._list(path) == "100" and w.synced
    assert c.calls[0] == (path, {"limit": jobwatch.LIST_PAGE}) and c.calls[1][1]["continue"] == "c1"
    assert [(k, b["metadata"]["name"]) for k, b in got] == [("ADDED", "a"), ("ADDED", "b")]
    assert all(b["kind"] == "GRPOJob" and b["apiVersion"] == "grpo.dev/v1alpha1" for _, b in got)
    assert all("managedFields" not in b["metadata"] for _, b in got) and got[0][1]["spec"] == {"x": 1}


@pytest.mark.asyncio
async def test_a_relist_reports_changes_only_and_a_vanished_job_as_deleted_with_its_last_body() -> None:
    w, got = make(FakeClient([[job("a"), job("b"), job("c")]]))
    path = f"{BASE}/namespaces/ns/grpojobs"
    await w._list(path)
    got.clear()
    w._client = lambda: FakeClient([[job("a"), job("b", rv=7)]])  # type: ignore[assignment,return-value]
    await w._list(path)  # after a 410 or an outage: a unchanged, b changed, c deleted meanwhile
    assert [(k, b["metadata"]["name"]) for k, b in got] == [("MODIFIED", "b"), ("DELETED", "c")]
    assert got[0][1]["spec"] == {"x": 7} and got[1][1]["metadata"]["uid"] == "u-c"


@pytest.mark.asyncio
async def test_a_relist_that_finds_a_job_under_a_new_uid_reports_the_old_one_deleted_first() -> None:
    w, got = make(FakeClient([[job("a")]]))
    path = f"{BASE}/namespaces/ns/grpojobs"
    await w._list(path)
    got.clear()
    w._client = lambda: FakeClient([[job("a", rv=9, uid="u-new")]])  # type: ignore[assignment,return-value]
    await w._list(path)
    assert [(k, b["metadata"]["uid"]) for k, b in got] == [("DELETED", "u-a"), ("ADDED", "u-new")]


@pytest.mark.asyncio
async def test_watch_events_pass_through_in_scope_and_410_means_list_again() -> None:
    events = [{"type": "ADDED", "object": {"kind": "GRPOJob", **job("a", ns="team-a", rv=101)}},
              {"type": "ADDED", "object": {"kind": "GRPOJob", **job("z", ns="other", rv=102)}},  # not ours
              {"type": "MODIFIED", "object": {"kind": "GRPOJob", **job("a", ns="team-a", rv=103)}},
              {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}},
              {"type": "DELETED", "object": {"kind": "GRPOJob", **job("a", ns="team-a", rv=151)}}]
    w, got = make(FakeClient([], events), namespaces=["team-*"])
    assert await w._watch(f"{BASE}/grpojobs", "100") == "151"
    assert [(k, b["metadata"]["name"], b["metadata"]["resourceVersion"]) for k, b in got] == [
        ("ADDED", "a", "101"), ("MODIFIED", "a", "103"), ("DELETED", "a", "151")]
    w._client = lambda: FakeClient([], [{"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}])  # type: ignore
    with pytest.raises(kube.Gone):
        await w._watch(f"{BASE}/grpojobs", "151")


def controller(leader_elect: bool) -> tuple[handlers.Controller, list[Any]]:
    c = handlers.Controller(Settings(namespaces=["ns"], leader_elect=leader_elect))
    calls: list[Any] = []
    c.ensure_background = lambda: calls.append("background")  # type: ignore[method-assign]
    c.kick = lambda key: calls.append(("kick", key))  # type: ignore[method-assign]

    async def release(key: Any, body: Any) -> None:
        calls.append(("release", key, body["metadata"]["uid"]))

    c.release_deleted_job = release  # type: ignore[method-assign]
    return c, calls


@pytest.mark.asyncio
async def test_a_standby_caches_nothing_and_a_leader_caches_kicks_and_releases_a_deleted_job() -> None:
    standby, calls = controller(leader_elect=True)
    standby.job_event("ADDED", {"kind": "GRPOJob", **job("a")})
    assert standby.observers.jobs == {} and calls == []
    active, calls = controller(leader_elect=False)
    active.job_event("ADDED", {"kind": "GRPOJob", **job("a")})
    assert ("ns", "a") in active.observers.jobs and calls == ["background", ("kick", ("ns", "a"))]
    active.job_event("DELETED", {"kind": "GRPOJob", **job("a", rv=2)})
    assert active.observers.jobs == {}
    await asyncio.gather(*active._releases)
    assert calls[-1] == ("release", ("ns", "a"), "u-a") and not active._releases
