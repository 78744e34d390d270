"""Follows the job pods (label grpo.dev/job-name) by list + watch and keeps one compact summary per pod.

Why not kopf for pods: kopf runs a worker, a cause, handler kwargs and a per-object memory for every pod event —
~20 % of the operator's CPU at 1000 jobs for jobs and pods together, two thirds of it pods (py-spy, see
docs/performance.md). Pods need none of it: the controller wants "what pods does job X have now" and a kick
when that changes. kopf still watches GRPOJobs
(peering, the admission webhook, login).

The guarantees the controller relies on:
  * `synced` is set only after every scope has been listed completely: before that, a pod that is not in the
    index may simply not be listed yet, and the controller must not read its absence as a deletion.
  * a scope re-lists after 410 Gone (its resourceVersion expired) or any error, and removes what the new list no
    longer has: a pod deleted while the watch was down is seen as gone, not kept forever.
  * every change of a pod's summary (and every removal) calls on_change(job key).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Optional

from . import kube

log = logging.getLogger("grpo_operator.podwatch")

Key = tuple[str, str]
# (job key, summary) for a pod, or None for a pod this controller does not follow
Summarize = Callable[[dict[str, Any]], Optional[tuple[Key, Any]]]

LIST_PAGE = 500
WATCH_SECONDS = 290  # the server ends each watch after this; we re-watch from the last resourceVersion


def _plain(ns: str) -> bool:
    return not any(ch in ns for ch in "!*?,")


def scopes_for(namespaces: Optional[Iterable[str]]) -> tuple[list[str], Optional[Callable[[str], bool]]]:
    """The pod list paths to follow and, for namespace patterns (kopf's globs), the filter on namespaces.
    None means every namespace."""
    if namespaces is None:
        return ["/api/v1/pods"], None
    names = list(namespaces)
    if all(_plain(n) for n in names):
        return [kube.path_for("Pod", n) for n in dict.fromkeys(names)], None
    from kopf._cogs.structs.references import match_namespace  # the same glob semantics kopf applies to jobs

    return ["/api/v1/pods"], lambda ns: any(match_namespace(ns, p) for p in names)


class PodWatch:
    def __init__(self, client: Callable[[], Optional[kube.Kube]], namespaces: Optional[Iterable[str]],
                 label: str, summarize: Summarize, on_change: Callable[[Key], None],
                 on_synced: Callable[[], None]):
        self._client = client
        self._paths, self._wanted = scopes_for(namespaces)
        self._label = label
        self._summarize = summarize
        self._on_change = on_change
        self._on_synced = on_synced
        self.index: dict[Key, dict[str, Any]] = {}  # job key -> pod name -> summary
        self._where: dict[tuple[str, str], tuple[Key, str]] = {}  # (ns, pod) -> (job key, scope path)
        self._unlisted = set(self._paths)
        self.synced = False
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ index
    def of(self, key: Key) -> list[Any]:
        """The summaries of job `key`'s pods."""
        pods = self.index.get(key)
        return list(pods.values()) if pods else []

    def _upsert(self, pod: dict[str, Any], scope: str) -> None:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        if self._wanted is not None and not self._wanted(ns):
            return
        got = self._summarize(pod)
        old = self._where.get((ns, name))
        if got is None:  # lost its label: no longer ours to follow
            self._remove(ns, name)
            return
        key, summary = got
        if old is not None and old[0] != key:
            self._remove(ns, name)
        pods = self.index.setdefault(key, {})
        if pods.get(name) != summary:
            pods[name] = summary
            self._where[(ns, name)] = (key, scope)
            self._on_change(key)

    def _remove(self, ns: str, name: str) -> None:
        old = self._where.pop((ns, name), None)
        if old is None:
            return
        pods = self.index.get(old[0])
        if pods is not None:
            pods.pop(name, None)
            if not pods:
                del self.index[old[0]]
        self._on_change(old[0])

    # ------------------------------------------------------------------ I/O
    def start(self) -> None:
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._follow(p), name=f"pods {p}") for p in self._paths]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _follow(self, path: str) -> None:
        delay = 0.5
        loop = asyncio.get_running_loop()
        while True:
            try:
                rv = await self._list(path)
                delay = 0.5
                while True:
                    started = loop.time()
                    rv = await self._watch(path, rv)
                    if loop.time() - started < 1.0:  # a server that ends watches at once must not make us spin
                        await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except kube.Gone:
                log.info("pods %s: resourceVersion expired; listing again", path)
                await asyncio.sleep(0.1)  # normal after an outage; a server that answers 410 to every watch must not spin us
            except Exception as exc:
                log.warning("pods %s: %s: %s; listing again in %.1fs", path, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _k(self) -> kube.Kube:
        k = self._client()
        if k is None:
            raise RuntimeError("not logged in yet")
        return k

    async def _list(self, path: str) -> str:
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"labelSelector": self._label, "limit": LIST_PAGE}
        while True:
            page = await self._k().request("GET", path, params=params)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                break
            params = {**params, "continue": meta["continue"]}
        seen = set()
        for pod in items:
            m = pod.get("metadata") or {}
            seen.add((m.get("namespace", ""), m.get("name", "")))
            self._upsert(pod, path)
        for where, (_, scope) in list(self._where.items()):
            if scope == path and where not in seen:
                self._remove(*where)
        if path in self._unlisted:
            self._unlisted.discard(path)
            if not self._unlisted and not self.synced:
                self.synced = True
                self._on_synced()
        return str(meta.get("resourceVersion") or "")

    async def _watch(self, path: str, rv: str) -> str:
        params = {"watch": "true", "labelSelector": self._label, "resourceVersion": rv,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        async for ev in self._k().watch(path, params, read_timeout=WATCH_SECONDS + 60):
            kind, obj = ev.get("type"), ev.get("object") or {}
            if kind == "ERROR":  # a Status object; 410 (Expired): the resourceVersion is too old, list again
                code = int(obj.get("code") or 500)
                raise kube.error_class(code)(code, str(obj.get("reason", "")), str(obj.get("message", "")), obj)
            new_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind in ("ADDED", "MODIFIED"):
                self._upsert(obj, path)
            elif kind == "DELETED":
                m = obj.get("metadata") or {}
                self._remove(m.get("namespace", ""), m.get("name", ""))
            if new_rv:
                rv = str(new_rv)
        return rv

