"""The pod watcher's own logic: which scopes it follows, how it splits a watch stream into events, and how list,
watch events and re-lists keep the per-job index (the real API server tests cover it end to end: restarts, 410s)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Optional

import pytest

from grpo_operator.controller import kube, podwatch
from grpo_operator.controller.pod_entry import pod_entry


def pod(name: str, job: Optional[str] = "j", ns: str = "ns", phase: str = "Pending", rv: int = 1) -> dict[str, Any]:
    labels = {"grpo.dev/job-name": job} if job else {}
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, "resourceVersion": str(rv), "uid": name},
            "spec": {"containers": [{"name": "trainer"}]}, "status": {"phase": phase}}


def test_scopes() -> None:
    assert podwatch.scopes_for(None) == (["/api/v1/pods"], None)
    paths, wanted = podwatch.scopes_for(["a", "b", "a"])
    assert paths == ["/api/v1/namespaces/a/pods", "/api/v1/namespaces/b/pods"] and wanted is None
    paths, wanted = podwatch.scopes_for(["team-*,!team-x"])  # kopf's namespace globs: one cluster-wide watch
    assert paths == ["/api/v1/pods"] and wanted is not None
    assert wanted("team-a") and not wanted("team-x") and not wanted("other")


def test_decode_lines_across_chunks_and_long_lines() -> None:
    big = {"type": "ADDED", "object": {"metadata": {"name": "p"}, "data": "x" * 300_000}}  # > aiohttp's line limit
    stream = (json.dumps({"type": "BOOKMARK"}) + "\n" + json.dumps(big) + "\n\n").encode()
    buf = bytearray()
    got = []
    for i in range(0, len(stream), 7000):
        got += kube.decode_lines(buf, stream[i:i + 7000])
    assert [e["type"] for e in got] == ["BOOKMARK", "ADDED"] and got[1] == big and not buf


class FakeClient:
    """Answers the watcher's list pages and one scripted watch stream."""

    def __init__(self, pages: list[list[dict[str, Any]]], events: Optional[list[dict[str, Any]]] = None):
        self.pages, self.events = pages, list(events or [])
        self.params: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
        self.params.append(dict(params))
        i = len(self.params) - 1
        more = {"continue": f"c{i + 1}"} if i + 1 < len(self.pages) else {}
        return {"metadata": {"resourceVersion": "100", **more}, "items": self.pages[i]}

    async def watch(self, path: str, params: dict[str, Any], read_timeout: float) -> AsyncIterator[dict[str, Any]]:
        for e in self.events:
            yield e


def make(client: Any, namespaces: Any = ("ns",)) -> tuple[podwatch.PodWatch, list[Any], list[int]]:
    changed: list[Any] = []
    synced: list[int] = []
    w = podwatch.PodWatch(lambda: client, list(namespaces) if namespaces is not None else None, "grpo.dev/job-name",
                          pod_entry, changed.append, lambda: synced.append(1))
    return w, changed, synced


@pytest.mark.asyncio
async def test_list_pages_then_sync_then_relist_drops_vanished_pods() -> None:
    c = FakeClient([[pod("a"), pod("b")], [pod("c", job="k"), pod("stray", job=None)]])
    w, changed, synced = make(c)
    assert await w._list("/api/v1/namespaces/ns/pods") == "100"
    assert c.params[0] == {"labelSelector": "grpo.dev/job-name", "limit": podwatch.LIST_PAGE}
    assert c.params[1]["continue"] == "c1"
    assert {k: sorted(v) for k, v in w.index.items()} == {("ns", "j"): ["a", "b"], ("ns", "k"): ["c"]}
    assert w.synced and synced == [1] and sorted(set(changed)) == [("ns", "j"), ("ns", "k")]
    # a re-list (after 410 or an outage) that no longer has b and c: both are gone, their jobs are kicked
    changed.clear()
    c2 = FakeClient([[pod("a")]])
    w._client = lambda: c2
    await w._list("/api/v1/namespaces/ns/pods")
    assert {k: sorted(v) for k, v in w.index.items()} == {("ns", "j"): ["a"]}
    assert sorted(changed) == [("ns", "j"), ("ns", "k")] and synced == [1]  # synced once only


@pytest.mark.asyncio
async def test_sync_waits_for_every_scope() -> None:
    w, _, synced = make(FakeClient([[], []]), namespaces=["a", "b"])
    await w._list("/api/v1/namespaces/a/pods")
    assert not w.synced and synced == []
    w._client = lambda: FakeClient([[]])
    await w._list("/api/v1/namespaces/b/pods")
    assert w.synced and synced == [1]


@pytest.mark.asyncio
async def test_watch_events_update_the_index_and_410_means_list_again() -> None:
    events = [{"type": "ADDED", "object": pod("a", rv=101)},
              {"type": "MODIFIED", "object": pod("a", phase="Running", rv=102)},
              {"type": "MODIFIED", "object": pod("a", phase="Running", rv=103)},  # same summary: no kick
              {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}},
              {"type": "ADDED", "object": pod("b", rv=151)},
              {"type": "DELETED", "object": pod("b", rv=152)}]
    w, changed, _ = make(FakeClient([], events))
    assert await w._watch("/api/v1/namespaces/ns/pods", "100") == "152"
    assert list(w.index[("ns", "j")]) == ["a"] and w.index[("ns", "j")]["a"][0].phase == "Running"
    assert changed == [("ns", "j")] * 4  # a added, a running, b added, b deleted
    gone = FakeClient([], [{"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}])
    w._client = lambda: gone
    with pytest.raises(kube.Gone):
        await w._watch("/api/v1/namespaces/ns/pods", "152")


@pytest.mark.asyncio
async def test_glob_scope_ignores_other_namespaces_and_relabelled_pods_leave() -> None:
    w, changed, _ = make(FakeClient([[pod("a", ns="team-a"), pod("z", ns="other")]]), namespaces=["team-*"])
    await w._list("/api/v1/pods")
    assert list(w.index) == [("team-a", "j")]
    w._upsert(pod("a", ns="team-a", job=None), "/api/v1/pods")  # its job label removed: no longer followed
    assert w.index == {} and changed[-1] == ("team-a", "j")


@pytest.mark.asyncio
async def test_a_server_that_ends_every_watch_at_once_does_not_make_it_spin() -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    starts: list[float] = []
    second = asyncio.Event()

    class Ending(FakeClient):
        async def watch(self, path: str, params: dict[str, Any], read_timeout: float) -> AsyncIterator[dict[str, Any]]:
            starts.append(loop.time())
            if len(starts) == 2:
                second.set()
            await asyncio.sleep(0)  # a real stream yields to the loop: without the guard this test fails, not hangs
            for e in self.events:
                yield e

    c = Ending([[pod("a")]])  # the watch stream ends at once, with nothing in it
    w, _, synced = make(c)
    task = asyncio.create_task(w._follow("/api/v1/namespaces/ns/pods"))
    await asyncio.wait_for(second.wait(), 30)  # the second watch began
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert synced == [1] and len(c.params) == 1  # listed once: an ended watch resumes from its resourceVersion
    assert starts[1] - starts[0] >= 1.0  # ~1 per second, not at once (thousands)
