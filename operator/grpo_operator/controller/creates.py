"""Creating a decided attempt's objects: render() them, refuse what the server would refuse without sending it (a
ConfigMap over the size limit, native sidecars on an API server older than 1.29: refused.py), create the ConfigMap,
Service and the gang scheduler's objects before the pods (the pods would use a wrong one otherwise), and judge a
409: ours is success, an older job's pod is the lifecycle's to delete, anything else's is a conflict the lifecycle
reports. A gang object the cluster cannot take (no CRD, no RBAC) is a Warning Event (its unit's reason and words:
render/gangs) and a later retry, with no pods.

Imports: api, rules, render, lifecycle and the controller's own modules (not handlers.py, which owns the Creator:
what it needs of the Controller is the Protocol below).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Protocol

from .. import api, lifecycle
from ..render import gangs, manifests, pod_template
from ..render import job as render_job
from ..rules import validation
from . import events, kube, refused
from .expectations import Expectations
from .ratelimit import RateLimiter
from .settings import Settings
from .workqueue import Key

log = logging.getLogger("grpo_operator")

GANG_OBJECT_EVENT_SECONDS = 300.0  # a gang object not created: the cause lasts until the CRD or the RBAC is there
# When to look at a job again:
CREATE_RETRY_SECONDS = 30.0  # a gang object could not be created, or the create was refused before it was sent
BEING_DELETED_RETRY_SECONDS = 0.5  # a create conflicted with an object of ours that was being deleted
FOREIGN_RETRY_SECONDS = 0.2  # a create conflicted with an object owned by something else: report it soon


class _Controller(Protocol):
    """What the creates use of handlers.Controller (which imports this module)."""

    config: Settings
    kube: Optional[kube.Kube]
    stats: dict[str, int]
    expectations: Expectations
    events: events.EventRecorder
    failed_create_events: RateLimiter  # refused.py's
    refused_creates: dict[Key, str]  # refused.py's

    def kick_later(self, key: Key, delay: float) -> None: ...


class Creator:
    """The create path of a reconcile pass; `sem` bounds the controller's API writes in flight."""

    def __init__(self, controller: _Controller, sem: asyncio.Semaphore):
        self.c = controller
        self._sem = sem
        self.gang_object_events = RateLimiter(GANG_OBJECT_EVENT_SECONDS)
        self._server_version: Optional[tuple[int, int]] = None  # (major, minor), read once when a job needs it

    async def create_decided(self, key: Key, body: dict[str, Any], res: validation.ValidationResult,
                             dec: lifecycle.Decision) -> None:
        # the commits staging recorded, in this very pass when it saw the download pod succeed
        status = dec.job_status or api.parse_status(body.get("status"))
        await self.create(key, body, res, dec.create_attempt, dec.create_pods,  # type: ignore[arg-type]
                          dec.groups, staged=status.stagedRevisions,
                          max_restarts=dec.max_restarts)

    async def create(self, key: Key, body: dict[str, Any], res: validation.ValidationResult, attempt: int,
                     pod_names: list[str], groups: Optional[Mapping[str, str]] = None,
                     staged: Sequence[api.StagedRevision] = (), max_restarts: Optional[int] = None) -> None:
        c = self.c
        assert c.kube is not None and res.job is not None and res.topology is not None
        ns, name = key
        uid = (body.get("metadata") or {}).get("uid", "")
        objs = render_job.render(res.job, res.topology, ns, uid=uid, image=c.config.image,
                                 cpu_image=c.config.cpu_image, attempt=attempt,
                                 metrics_port=c.config.trainer_metrics_port, groups=groups,
                                 network_policy=c.config.network_policy(),
                                 staged=staged, max_restarts=max_restarts)
        too_large = render_job.oversized(objs)
        if too_large:  # the server would refuse it: say so without sending anything
            refused.note(c, key, manifests.names(name).config_map, too_large, body)
            c.kick_later(key, CREATE_RETRY_SECONDS)
            return
        no_sidecars = await self._native_sidecars_missing(objs)
        if no_sidecars:
            refused.note(c, key, name, no_sidecars, body)
            c.kick_later(key, CREATE_RETRY_SECONDS)
            return
        wanted = set(pod_names)
        support = [o for o in objs if o["kind"] != "Pod"]
        pods = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["name"] in wanted]
        results = await asyncio.gather(*(self.create_one(key, uid, o, body) for o in support))
        if not all(results):
            return  # a ConfigMap/Service/gang object of ours is missing or owned by something else: pods would use the wrong one
        c.expectations.created(key, [p["metadata"]["name"] for p in pods], attempt)
        await asyncio.gather(*(self.create_one(key, uid, o, body) for o in pods))  # raises a refusal
        c.refused_creates.pop(key, None)  # everything was created: the next pass clears CreateFailed

    async def _native_sidecars_missing(self, objs: list[dict[str, Any]]) -> Optional[str]:
        """spec.template.sidecars are native sidecars (Kubernetes 1.29+). An older API server accepts such a pod and
        drops the sidecar's restartPolicy, so the pod would wait in Init forever: say why instead of creating it."""
        if not any(pod_template.has_native_sidecars(o) for o in objs):
            return None
        assert self.c.kube is not None
        if self._server_version is None:
            info = await self.c.kube.request("GET", "/version")
            self._server_version = kube.server_version(info)
        if self._server_version >= pod_template.NATIVE_SIDECARS_SINCE:
            return None
        since = ".".join(map(str, pod_template.NATIVE_SIDECARS_SINCE))
        return (f"spec.template.sidecars need native sidecar containers (Kubernetes {since} or newer) and this "
                f"cluster's API server is {'.'.join(map(str, self._server_version))}: remove spec.template.sidecars "
                "(an init container runs to completion before the trainer instead); no pod was created")

    async def create_one(self, key: Key, uid: str, obj: dict[str, Any], job: Optional[dict[str, Any]] = None) -> bool:
        c = self.c
        assert c.kube is not None
        kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            async with self._sem:
                await c.kube.create(obj)
            c.stats["creates"] += 1
            return True
        except kube.Conflict:
            pass  # AlreadyExists (or our own ambiguous earlier write): ours is success
        except kube.ApiError as exc:
            unit = gangs.owner_of(obj)
            if unit is None or exc.status not in (403, 404):
                refused.report(c, key, obj, exc, job)  # a FailedCreate Event and condition: the server's message
                if kind == "Pod":
                    c.expectations.refused(key, name)
                raise
            # the gang scheduler's CRD is not installed, or the operator may not create its objects: no pods (the
            # scheduler would refuse them, or schedule them one by one); say so, and try again later
            reason, why = unit.not_created(obj, exc.status, exc.reason)
            log.warning("%s/%s: %s", ns, key[1], why)
            if job is not None and self.gang_object_events.allow((ns, name)):
                c.events.record(job, lifecycle.JobEvent("Warning", reason, why))
            c.kick_later(key, CREATE_RETRY_SECONDS)
            return False
        try:
            async with self._sem:
                existing = await c.kube.get(kind, ns, name, api_version=obj.get("apiVersion"))
        except kube.NotFound:
            c.kick_later(key, BEING_DELETED_RETRY_SECONDS)  # it was being deleted; try again
            return False
        emeta = existing.get("metadata") or {}
        owners = [r for r in emeta.get("ownerReferences") or [] if r.get("controller")]
        if owners and owners[0].get("uid") == uid:
            return True
        if owners and owners[0].get("kind") == api.KIND and kind == "Pod":
            return True  # an older job of the same name: the lifecycle deletes it through the index
        info = lifecycle.PodInfo(name=f"{kind.lower()}/{name}", owner_uid=(owners[0].get("uid") if owners else None),
                                 owner_kind=(owners[0].get("kind") if owners else None))
        c.expectations.foreign(key, name, info)
        log.warning("%s %s/%s exists and is not owned by GRPOJob %s", kind, ns, name, key[1])
        c.kick_later(key, FOREIGN_RETRY_SECONDS)
        return False
