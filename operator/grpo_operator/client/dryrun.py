"""A server-side dry run of a submission: the GRPOJob and every object the operator would create for it (render's
objects), each sent with dryRun=All, so what only the cluster knows (quota, PodSecurity, policy engines, a missing
PriorityClass, an absent PodGroup API) answers before any pod exists. Nothing is persisted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .types import Job


@dataclass
class DryRunObject:
    kind: str
    name: str
    error: str = ""  # the API server's refusal, "" when it would have created the object

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass
class DryRunReport:
    job: Job  # as the API server (and its admission webhooks) would have stored it
    objects: list[DryRunObject] = field(default_factory=list)

    @property
    def refused(self) -> list[DryRunObject]:
        return [o for o in self.objects if not o.ok]

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job.as_dict(), "objects": [{"kind": o.kind, "name": o.name, "ok": o.ok, "error": o.error}
                                                        for o in self.objects]}


def plural(kind: str) -> str:
    """The resource of a kind render() creates (Pod → pods, NetworkPolicy → networkpolicies, PodGroup → podgroups)."""
    low = kind.lower()
    return low[:-1] + "ies" if low.endswith("y") else low + "s"


def create_path(obj: dict[str, Any], namespace: str) -> str:
    """The collection an object is created in: /api/v1/… for the core group, /apis/<group>/<version>/… otherwise."""
    api_version = str(obj.get("apiVersion") or "v1")
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural(str(obj.get('kind') or ''))}"


def name_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")
