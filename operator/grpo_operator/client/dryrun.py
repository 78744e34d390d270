"""A server-side dry run of a submission: the GRPOJob and every object the operator would create for it (render's
objects), each sent with dryRun=All, so what only the cluster knows (quota, PodSecurity, policy engines, a missing
PriorityClass, an absent PodGroup API) answers before any pod exists. Nothing is persisted.

The report types, the paths, and dry_run_job (GRPOClient.dry_run_job delegates here; client.py imports us). May
import what the client package may (_contract for render, errors, inputs, types, the `kubernetes` client) and the
standard library."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from . import _contract as c
from .errors import api_error
from .inputs import JobInput
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


def dry_run_job(client: Any, job: JobInput, name: Optional[str] = None, namespace: Optional[str] = None,
                labels: Optional[Mapping[str, str]] = None, queue: Optional[str] = None,
                image: Optional[str] = None) -> DryRunReport:
    """GRPOClient.dry_run_job on `client` (a GRPOClient): the job created with dryRun=All (its refusal raises as in
    create_job), then each object render() makes for it, each refusal in the report."""
    body = client.validate_job(job, name, namespace, labels, queue)
    stored = client._create(body, dry_run="All")
    ns = body["metadata"]["namespace"]
    uid = str((stored.get("metadata") or {}).get("uid") or uuid.uuid4())
    objects = [DryRunObject(str(o.get("kind")), name_of(o), dry_create(client, o, ns))
               for o in c.render(body, ns, uid, image)]
    return DryRunReport(Job.from_dict(stored), objects)


def dry_create(client: Any, obj: dict[str, Any], namespace: str) -> str:
    """The API server's refusal of creating obj with dryRun=All, "" when it accepts it."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        request = client.api_client.param_serialize(
            "POST", create_path(obj, namespace), query_params=[("dryRun", "All")], body=obj,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"])
        resp = client.api_client.call_api(*request, _request_timeout=60)
        data = resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason,
                               body=data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data))
    except ApiException as exc:
        return str(api_error(exc, "refused by the API server"))
    except (OSError, HTTPError) as exc:
        raise api_error(exc, f"dry run of {obj.get('kind')} {name_of(obj)}") from None
    return ""
