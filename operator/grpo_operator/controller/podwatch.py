"""Follows the job pods (label grpo.dev/job-name) by list + watch (listwatch.py) and keeps one compact summary per
pod, indexed by job; every change of a pod's summary (and every removal) calls on_change(job key).

Why not kopf for pods: kopf runs a worker, a cause, handler kwargs and a per-object memory for every pod event —
~20 % of the operator's CPU at 1000 jobs for jobs and pods together, two thirds of it pods (py-spy, see
docs/performance.md). Pods need none of it: the controller wants "what pods does job X have now" and a kick
when that changes. GRPOJobs are followed the same way (jobwatch.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Optional

from . import kube
from .listwatch import LIST_PAGE, WATCH_SECONDS, ListWatch, Name
from .listwatch import scopes_for as _scopes_for

__all__ = ["LIST_PAGE", "WATCH_SECONDS", "PodWatch", "scopes_for"]

Key = tuple[str, str]
# (job key, summary) for a pod, or None for a pod this controller does not follow
Summarize = Callable[[dict[str, Any]], Optional[tuple[Key, Any]]]


def scopes_for(namespaces: Optional[Iterable[str]]) -> tuple[list[str], Optional[Callable[[str], bool]]]:
    """The pod list paths to follow and, for namespace patterns (kopf's globs), the filter on namespaces.
    None means every namespace."""
    return _scopes_for(namespaces, "/api/v1/pods", lambda ns: kube.path_for("Pod", ns))


class PodWatch(ListWatch):
    what = "pods"

    def __init__(self, client: Callable[[], Optional[kube.Kube]], namespaces: Optional[Iterable[str]],
                 label: str, summarize: Summarize, on_change: Callable[[Key], None],
                 on_synced: Callable[[], None]):
        super().__init__(client, *scopes_for(namespaces), label, on_synced)
        self._summarize = summarize
        self._on_change = on_change
        self.index: dict[Key, dict[str, Any]] = {}  # job key -> pod name -> summary
        self._where: dict[Name, tuple[Key, str]] = {}  # (ns, pod) -> (job key, scope path)

    # ------------------------------------------------------------------ index
    def of(self, key: Key) -> list[Any]:
        """The summaries of job `key`'s pods."""
        pods = self.index.get(key)
        return list(pods.values()) if pods else []

    def _upsert(self, pod: dict[str, Any], scope: str) -> None:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        got = self._summarize(pod)
        old = self._where.get((ns, name))
        if got is None:  # lost its label: no longer ours to follow
            self._drop(ns, name)
            return
        key, summary = got
        if old is not None and old[0] != key:
            self._drop(ns, name)
        pods = self.index.setdefault(key, {})
        if pods.get(name) != summary:
            pods[name] = summary
            self._where[(ns, name)] = (key, scope)
            self._on_change(key)

    def _remove(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        self._drop(meta.get("namespace", ""), meta.get("name", ""))

    def _vanished(self, scope: str, seen: set[Name]) -> None:
        for where, (_, path) in list(self._where.items()):
            if path == scope and where not in seen:
                self._drop(*where)

    def _drop(self, ns: str, name: str) -> None:
        old = self._where.pop((ns, name), None)
        if old is None:
            return
        pods = self.index.get(old[0])
        if pods is not None:
            pods.pop(name, None)
            if not pods:
                del self.index[old[0]]
        self._on_change(old[0])
