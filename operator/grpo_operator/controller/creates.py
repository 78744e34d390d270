"""Creating a decided attempt's objects: render() them, refuse what the server would refuse without sending it (a
ConfigMap over the size limit, native sidecars on an API server older than 1.29: refused.py), create the ConfigMap,
Service and the gang scheduler's objects before the pods (the pods would use a wrong one otherwise), and judge a
409: ours is success, an older job's pod is the lifecycle's to delete, anything else's is a conflict the lifecycle
reports. A gang object the cluster cannot take (no CRD, no RBAC) is a Warning Event (its unit's reason and words:
render/gangs) and a later retry, with no pods.

The Creator is the writer's (writer.py): it gets the writer's client handle, write slots, counters, Events and
refusals, and the observers' expectations (what it created is seen before the watch shows it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from .. import api, lifecycle
from ..render import gangs, manifests, pod_template
from ..render import job as render_job
from ..rules import validation
from . import events, kube
from .expectations import Expectations
from .ratelimit import RateLimiter
from .refused import Refusals
from .settings import Settings
from .workqueue import Key

log = logging.getLogger("grpo_operator")

GANG_OBJECT_EVENT_SECONDS = 300.0  # a gang object not created: the cause lasts until the CRD or the RBAC is there
# When to look at a job again:
CREATE_RETRY_SECONDS = 30.0  # a gang object could not be created, or the create was refused before it was sent
BEING_DELETED_RETRY_SECONDS = 0.5  # a create conflicted with an object of ours that was being deleted
FOREIGN_RETRY_SECONDS = 0.2  # a create conflicted with an object owned by something else: report it soon


class Creator:
    """The create path of a reconcile pass; `sem` bounds the operator's API writes in flight, `stats` counts creates,
    `kick_later` brings the job back for a retry."""

    def __init__(self, config: Settings, kube_of: Callable[[], Optional[kube.Kube]], sem: asyncio.Semaphore,
                 stats: dict[str, int], expectations: Expectations, recorder: events.EventRecorder,
                 refusals: Refusals, kick_later: Callable[[Key, float], None]):
        self.config, self.kube_of, self._sem, self.stats = config, kube_of, sem, stats
        self.expectations, self.events, self.refusals, self.kick_later = expectations, recorder, refusals, kick_later
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
        cfg = self.config
        assert self.kube_of() is not None and res.job is not None and res.topology is not None
        ns, name = key
        uid = (body.get("metadata") or {}).get("uid", "")
        objs = render_job.render(res.job, res.topology, ns, uid=uid, image=cfg.image,
                                 cpu_image=cfg.cpu_image, attempt=attempt,
                                 metrics_port=cfg.trainer_metrics_port, groups=groups,
                                 network_policy=cfg.network_policy(),
                                 staged=staged, max_restarts=max_restarts)
        too_large = render_job.oversized(objs)
        if too_large:  # the server would refuse it: say so without sending anything
            self.refusals.note(key, manifests.names(name).config_map, too_large, body)
            self.kick_later(key, CREATE_RETRY_SECONDS)
            return
        no_sidecars = await self._native_sidecars_missing(objs)
        if no_sidecars:
            self.refusals.note(key, name, no_sidecars, body)
            self.kick_later(key, CREATE_RETRY_SECONDS)
            return
        wanted = set(pod_names)
        support = [o for o in objs if o["kind"] != "Pod"]
        pods = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["name"] in wanted]
        results = await asyncio.gather(*(self.create_one(key, uid, o, body) for o in support))
        if not all(results):
            return  # a ConfigMap/Service/gang object of ours is missing or owned by something else: pods would use the wrong one
        self.expectations.created(key, [p["metadata"]["name"] for p in pods], attempt)
        await asyncio.gather(*(self.create_one(key, uid, o, body) for o in pods))  # raises a refusal
        self.refusals.forget(key)  # everything was created: the next pass clears CreateFailed

    async def _native_sidecars_missing(self, objs: list[dict[str, Any]]) -> Optional[str]:
        """spec.template.sidecars are native sidecars (Kubernetes 1.29+). An older API server accepts such a pod and
        drops the sidecar's restartPolicy, so the pod would wait in Init forever: say why instead of creating it."""
        if not any(pod_template.has_native_sidecars(o) for o in objs):
            return None
        if self._server_version is None:
            info = await self._kube().request("GET", "/version")
            self._server_version = kube.server_version(info)
        if self._server_version >= pod_template.NATIVE_SIDECARS_SINCE:
            return None
        since = ".".join(map(str, pod_template.NATIVE_SIDECARS_SINCE))
        return (f"spec.template.sidecars need native sidecar containers (Kubernetes {since} or newer) and this "
                f"cluster's API server is {'.'.join(map(str, self._server_version))}: remove spec.template.sidecars "
                "(an init container runs to completion before the trainer instead); no pod was created")

    def _kube(self) -> kube.Kube:
        k = self.kube_of()
        assert k is not None  # read at each request, as a new login replaces it; a pass runs only once logged in
        return k

    async def create_one(self, key: Key, uid: str, obj: dict[str, Any], job: Optional[dict[str, Any]] = None) -> bool:
        kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            async with self._sem:
                await self._kube().create(obj)
            self.stats["creates"] += 1
            return True
        except kube.Conflict:
            pass  # AlreadyExists (or our own ambiguous earlier write): ours is success
        except kube.ApiError as exc:
            unit = gangs.owner_of(obj)
            if unit is None or exc.status not in (403, 404):
                self.refusals.report(key, obj, exc, job)  # a FailedCreate Event and condition: the server's message
                if kind == "Pod":
                    self.expectations.refused(key, name)
                raise
            # the gang scheduler's CRD is not installed, or the operator may not create its objects: no pods (the
            # scheduler would refuse them, or schedule them one by one); say so, and try again later
            reason, why = unit.not_created(obj, exc.status, exc.reason)
            log.warning("%s/%s: %s", ns, key[1], why)
            if job is not None and self.gang_object_events.allow((ns, name)):
                self.events.record(job, lifecycle.JobEvent("Warning", reason, why))
            self.kick_later(key, CREATE_RETRY_SECONDS)
            return False
        try:
            async with self._sem:
                existing = await self._kube().get(kind, ns, name, api_version=obj.get("apiVersion"))
        except kube.NotFound:
            self.kick_later(key, BEING_DELETED_RETRY_SECONDS)  # it was being deleted; try again
            return False
        emeta = existing.get("metadata") or {}
        owners = [r for r in emeta.get("ownerReferences") or [] if r.get("controller")]
        if owners and owners[0].get("uid") == uid:
            return True
        if owners and owners[0].get("kind") == api.KIND and kind == "Pod":
            return True  # an older job of the same name: the lifecycle deletes it through the index
        info = lifecycle.PodInfo(name=f"{kind.lower()}/{name}", owner_uid=(owners[0].get("uid") if owners else None),
                                 owner_kind=(owners[0].get("kind") if owners else None))
        self.expectations.foreign(key, name, info)
        log.warning("%s %s/%s exists and is not owned by GRPOJob %s", kind, ns, name, key[1])
        self.kick_later(key, FOREIGN_RETRY_SECONDS)
        return False
