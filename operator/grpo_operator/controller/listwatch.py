"""List + watch of one kind of object in the operator's scopes, re-listing after 410 Gone or any error: the loop that
the pod watch (podwatch.py) and the GRPOJob watch (jobwatch.py) share; they keep what they need of each object.

The guarantees both rely on:
  * `synced` is set only after every scope has been listed completely: before that, an object that is not known may
    simply not be listed yet, and must not be read as deleted.
  * a scope re-lists after 410 Gone (its resourceVersion expired) or any error, and the subclass is told what the new
    list no longer has (`_vanished`): an object deleted while the watch was down is seen as gone, not kept forever.
  * a watch resumes from the last resourceVersion it saw (bookmarks included), so a watch the server ends on time
    costs one request, not a re-list.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Optional

from . import kube

log = logging.getLogger("grpo_operator.listwatch")

Name = tuple[str, str]  # (namespace, name) of a watched object

LIST_PAGE = 500
WATCH_SECONDS = 290  # the server ends each watch after this; we re-watch from the last resourceVersion


def _plain(ns: str) -> bool:
    return not any(ch in ns for ch in "!*?,")


def scopes_for(namespaces: Optional[Iterable[str]], everywhere: str,
               in_namespace: Callable[[str], str]) -> tuple[list[str], Optional[Callable[[str], bool]]]:
    """The list paths to follow (`everywhere`: the cluster-wide collection; `in_namespace(ns)`: a namespace's) and,
    for namespace patterns (kopf's globs), the filter on namespaces. `namespaces` None means every namespace."""
    if namespaces is None:
        return [everywhere], None
    names = list(namespaces)
    if all(_plain(n) for n in names):
        return [in_namespace(n) for n in dict.fromkeys(names)], None
    from kopf._cogs.structs.references import match_namespace  # the glob semantics kopf gives --namespace

    return [everywhere], lambda ns: any(match_namespace(ns, p) for p in names)


async def list_pages(client: kube.Kube, path: str, params: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """Every item of a list, page by page (`params` plus limit and continue), and the list's resourceVersion."""
    items: list[dict[str, Any]] = []
    params = {**params, "limit": LIST_PAGE}
    while True:
        page = await client.request("GET", path, params=params)
        items.extend(page.get("items") or [])
        meta = page.get("metadata") or {}
        if not meta.get("continue"):
            return items, str(meta.get("resourceVersion") or "")
        params = {**params, "continue": meta["continue"]}


class ListWatch:
    """Follows `paths` (from scopes_for); subclasses keep the objects (`_upsert`, `_remove`, `_vanished`)."""

    what = "objects"  # for the log

    def __init__(self, client: Callable[[], Optional[kube.Kube]], paths: list[str],
                 wanted: Optional[Callable[[str], bool]], label: Optional[str], on_synced: Callable[[], None]):
        self._client = client
        self._paths, self._wanted = paths, wanted
        self._label = label
        self._on_synced = on_synced
        self._unlisted = set(self._paths)
        self.synced = False
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ what subclasses keep
    def _upsert(self, obj: dict[str, Any], scope: str) -> None:
        raise NotImplementedError

    def _remove(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _vanished(self, scope: str, seen: set[Name]) -> None:
        """After a complete list of `scope`: what is kept from it and not in `seen` is gone."""
        raise NotImplementedError

    def _in_scope(self, obj: dict[str, Any]) -> bool:
        return self._wanted is None or self._wanted((obj.get("metadata") or {}).get("namespace", ""))

    # ------------------------------------------------------------------ I/O
    def start(self) -> None:
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._follow(p), name=f"{self.what} {p}") for p in self._paths]

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
                log.info("%s %s: resourceVersion expired; listing again", self.what, path)
                await asyncio.sleep(0.1)  # normal after an outage; a server that answers 410 to every watch must not spin us
            except Exception as exc:
                log.warning("%s %s: %s: %s; listing again in %.1fs", self.what, path, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _k(self) -> kube.Kube:
        k = self._client()
        if k is None:
            raise RuntimeError("not logged in yet")
        return k

    def _selector(self) -> dict[str, Any]:
        return {"labelSelector": self._label} if self._label else {}

    async def _list(self, path: str) -> str:
        items, rv = await list_pages(self._k(), path, self._selector())
        seen: set[Name] = set()
        for obj in items:
            m = obj.get("metadata") or {}
            seen.add((m.get("namespace", ""), m.get("name", "")))
            if self._in_scope(obj):
                self._upsert(obj, path)
        self._vanished(path, seen)
        if path in self._unlisted:
            self._unlisted.discard(path)
            if not self._unlisted and not self.synced:
                self.synced = True
                self._on_synced()
        return rv

    async def _watch(self, path: str, rv: str) -> str:
        params = {"watch": "true", **self._selector(), "resourceVersion": rv,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        async for ev in self._k().watch(path, params, read_timeout=WATCH_SECONDS + 60):
            kind, obj = ev.get("type"), ev.get("object") or {}
            if kind == "ERROR":  # a Status object; 410 (Expired): the resourceVersion is too old, list again
                code = int(obj.get("code") or 500)
                raise kube.error_class(code)(code, str(obj.get("reason", "")), str(obj.get("message", "")), obj)
            new_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind in ("ADDED", "MODIFIED") and self._in_scope(obj):
                self._upsert(obj, path)
            elif kind == "DELETED" and self._in_scope(obj):
                self._remove(obj)
            if new_rv:
                rv = str(new_rv)
        return rv
