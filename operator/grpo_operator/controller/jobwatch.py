"""Follows the GRPOJobs in the operator's scopes by list + watch (listwatch.py) and hands each event to the
controller as (type, body): ADDED/MODIFIED with the object, DELETED with the last body seen — also for a job that a
re-list (after 410 Gone or an outage) no longer has, or has under a new uid: deleted (and created again) while the
watch was down.

Why not kopf's watch: kopf runs a worker task, a cause, a patch, a logger and handler arguments for every event of
every object — a sixth of the operator's CPU in a burst of 1000 jobs (py-spy; docs/performance.md) for a handler
that only caches the job and kicks its reconciler. kopf still serves the webhook, the login and the liveness probe,
and with `--peering` (which pauses only kopf's own watches) kopf's watch feeds the same entry point instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Optional

from .. import api
from . import kube
from .listwatch import LIST_PAGE, ListWatch, Name, scopes_for

__all__ = ["LIST_PAGE", "JobWatch", "OnEvent", "as_job", "job_scopes", "without_managed_fields"]

OnEvent = Callable[[str, dict[str, Any]], None]  # (ADDED | MODIFIED | DELETED, the job's body)


def without_managed_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The job without metadata.managedFields (the server's field-ownership bookkeeping: often half the body, never
    read here); the same dict when it has none."""
    meta = body.get("metadata") or {}
    if "managedFields" not in meta:
        return body
    return {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def as_job(item: dict[str, Any]) -> dict[str, Any]:
    """A listed or watched GRPOJob as the controller keeps it: with its kind (a list's items carry none; the watch's
    objects and the validator's documents do), without managedFields."""
    if "kind" not in item:
        item = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, **item}
    return without_managed_fields(item)


def job_scopes(namespaces: Optional[Iterable[str]]) -> tuple[list[str], Optional[Callable[[str], bool]]]:
    return scopes_for(namespaces, f"/apis/{api.GROUP}/{api.VERSION}/{api.PLURAL}",
                      lambda ns: kube.path_for(api.KIND, ns))


class JobWatch(ListWatch):
    what = "grpojobs"

    def __init__(self, client: Callable[[], Optional[kube.Kube]], namespaces: Optional[Iterable[str]],
                 on_event: OnEvent):
        super().__init__(client, *job_scopes(namespaces), None, lambda: None)
        self._on_event = on_event
        # (ns, name) -> (scope path, the last body seen): a job gone from a re-list is reported deleted with it
        self._known: dict[Name, tuple[str, dict[str, Any]]] = {}

    def _upsert(self, obj: dict[str, Any], scope: str) -> None:
        obj = as_job(obj)
        meta = obj.get("metadata") or {}
        name = (meta.get("namespace", ""), meta.get("name", ""))
        old = self._known.get(name)
        if old is not None and (old[1].get("metadata") or {}).get("uid") != meta.get("uid"):
            self._remove(old[1])  # deleted and created again while the watch was down: the old job is gone first
            old = None
        elif old is not None and (old[1].get("metadata") or {}).get("resourceVersion") == meta.get("resourceVersion"):
            return  # a re-list's copy of what the watch already delivered
        self._known[name] = (scope, obj)
        self._on_event("MODIFIED" if old is not None else "ADDED", obj)

    def _remove(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self._known.pop((meta.get("namespace", ""), meta.get("name", "")), None)
        self._on_event("DELETED", obj)

    def _vanished(self, scope: str, seen: set[Name]) -> None:
        for name, (path, body) in list(self._known.items()):
            if path == scope and name not in seen:
                self._remove(body)
