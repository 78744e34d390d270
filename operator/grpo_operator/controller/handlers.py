"""The reconciler (Controller) and its kopf registration: I/O only. Every decision is lifecycle.decide().

How jobs and pods are followed (and why):
  * GRPOJobs through kopf (kopf.on.event: peering, login and the webhook are kopf's too); the handler caches the
    job and *kicks* a per-job reconciler; it keeps no state in the objects (no kopf annotations, no finalizers:
    zero extra writes per job).
  * pods labelled grpo.dev/job-name through our own list + watch (podwatch.py), keyed by (namespace, job name),
    holding compact lifecycle.PodInfo summaries; a change kicks the job's reconciler. kopf's per-event machinery
    for pods cost ~13 % of the operator's CPU at 1000 jobs (py-spy) for nothing we need. No reconcile runs before every watched scope has
    been listed, so a freshly started operator never mistakes "not listed yet" for "deleted": no spurious gang
    restarts after an operator restart.
  * the reconciler runs on a work queue (workqueue.py): one coalescing asyncio task per job, at most one reconcile
    of a job at a time, kicks arriving meanwhile fold into one more pass. It reads the cached job + the pod index, calls
    lifecycle.decide(), then writes: status first (a merge patch on the status subresource, only when it
    differs), then deletions, creations; Events go to a background recorder (events.py). Timers (backoff,
    deadline, TTL) and a periodic resync of every job re-kick it, so status converges even when a write or an
    event was lost.
  * pods it created or deleted but the watch does not show yet are expectations (expectations.py).
  * live progress (scraper.py): every GRPO_PROGRESS_INTERVAL_SECONDS a background task GETs /metrics of the running jobs'
    trainer pods (the pod index also holds their pod IP and `metrics` port; only the known global-rank-0 pod once
    it is found), turns the text into status.progress (lifecycle/progress.py, pure) and kicks the job's reconciler, which puts it
    into the status write: for free when the status changes anyway, else at most once per interval per job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, Optional

import kopf

from .. import api, lifecycle
from ..api import gang as gang_names
from ..api.status import Phase
from ..lifecycle import progress as progress_mod
from ..render import manifests
from ..rules import validation
from . import events, ha, kube, podwatch, refused, webhookconfig
from . import metrics as opmetrics
from .expectations import Expectations
from .scraper import ProgressScraper
from .settings import Settings
from .workqueue import Key, WorkQueue

log = logging.getLogger("grpo_operator")

VALIDATION_CACHE_SIZE = 1024


def _rv(body: Any) -> Optional[int]:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion"))
    except (TypeError, ValueError):
        return None


def endpoint_of_pod(meta: Any, spec: Any, status: Any) -> progress_mod.Endpoint:
    """Where a trainer pod serves its metrics: status.podIP and the trainer container's port named `metrics`."""
    port = None
    for c in (spec or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == manifests.METRICS_PORT_NAME and isinstance(p.get("containerPort"), int):
                port = p["containerPort"]
    ann = meta.get("annotations") or {}
    return progress_mod.Endpoint(
        pod=meta.get("name", ""), ip=(status or {}).get("podIP") or None, port=port,
        attempt=lifecycle.as_int(ann.get(manifests.ANNOTATION_ATTEMPT), 0),
        running=(status or {}).get("phase") == lifecycle.PodPhase.RUNNING and not meta.get("deletionTimestamp"))


def pod_entry(pod: dict[str, Any]) -> Optional[tuple[Key, tuple[lifecycle.PodInfo, Optional[progress_mod.Endpoint]]]]:
    """What the pod index keeps of a pod, under its job's key; None for a pod of no job."""
    meta = pod.get("metadata") or {}
    job = job_key_of_pod(meta)
    if not job:
        return None
    trainer = (meta.get("labels") or {}).get(manifests.LABEL_ROLE, lifecycle.ROLE_TRAINER) == lifecycle.ROLE_TRAINER
    endpoint = endpoint_of_pod(meta, pod.get("spec"), pod.get("status")) if trainer else None
    return (meta.get("namespace", ""), job), (lifecycle.summarize_pod(pod), endpoint)


def job_key_of_pod(meta: Any) -> Optional[str]:
    ann = meta.get("annotations") or {}
    name = ann.get(manifests.ANNOTATION_JOB)
    if name:
        return name
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == api.KIND:
            return ref.get("name")
    return (meta.get("labels") or {}).get(manifests.LABEL_JOB)


class Controller:
    """Per-operator state: the job cache, the pod index, expectations and the reconcile tasks."""

    def __init__(self, config: Settings):
        self.config = config
        self.kube: Optional[kube.Kube] = None
        self.jobs: dict[Key, dict[str, Any]] = {}
        # pod name -> (PodInfo, progress.Endpoint or None) per job; the endpoint is a trainer pod's metrics address
        self.pods: Optional[podwatch.PodWatch] = None
        # bounded: a parsed spec is ~15 KB. 1024 covers a burst of 1000 new jobs, whose second pass (after their pods
        # appear) comes behind every other first pass: at 256 most of them were parsed twice.
        self._vcache: OrderedDict[Key, tuple[Any, validation.ValidationResult]] = OrderedDict()
        self._sem = asyncio.Semaphore(config.max_concurrent_writes)  # API writes in flight
        self.queue = WorkQueue(lambda key: self.reconcile(key), 2 * max(config.max_concurrent_writes, 1),
                               config.resync_seconds, lambda: self.jobs)
        self.expectations = Expectations(config.policy.expectation_ttl)
        self.progress = ProgressScraper(config.progress_interval, self.jobs, self._endpoints, self.kick,
                                        self.kick_later)
        self.events = events.EventRecorder(self._send_event)
        self.stats = {"reconciles": 0, "status_writes": 0, "creates": 0, "deletes": 0}
        self.gate = ha.Gate(config.leader_elect)  # --leader-elect: a standby acts on nothing (ha.py)

    def __copy__(self) -> Controller:
        # kopf shallow-copies the operator's memo for every object it watches (3000 copies at 1000 jobs); the
        # controller is shared state by design, so every object gets the one instance.
        return self

    # ------------------------------------------------------------------ scheduling
    def kick(self, key: Key) -> None:
        self.queue.kick(key)

    def kick_later(self, key: Key, delay: float) -> None:
        self.queue.kick_later(key, delay)

    def kick_all(self) -> None:
        self.queue.kick_all()

    def forget(self, key: Key) -> None:
        self.jobs.pop(key, None)
        self._vcache.pop(key, None)
        self.queue.forget(key)
        self.expectations.forget(key)
        self.progress.forget(key)

    def ensure_background(self) -> None:
        self.queue.start_resync()
        self.progress.start()
        if self.pods is None:
            cfg = self.config
            self.pods = podwatch.PodWatch(lambda: self.kube, None if cfg.all_namespaces else cfg.namespaces,
                                          manifests.LABEL_JOB, pod_entry, self._pod_changed, self.kick_all)
            self.pods.start()

    async def close(self) -> None:
        """Stop everything this controller started and close its connections (kopf's cleanup calls it)."""
        self.queue.close()
        await self.progress.close()
        if self.pods is not None:
            await self.pods.close()
        await self.events.close()
        if self.kube is not None:
            await self.kube.close()

    def _endpoints(self, key: Key) -> list[progress_mod.Endpoint]:
        return [e for _, e in self.pods.of(key) if e is not None] if self.pods is not None else []

    def _pod_changed(self, key: Key) -> None:
        if key in self.jobs:
            self.kick(key)

    # ------------------------------------------------------------------ cache
    def observe_job(self, body: dict[str, Any]) -> Key:
        meta = body.get("metadata") or {}
        if "managedFields" in meta:  # the server's field-ownership bookkeeping: often half the body, never read here
            meta = {k: v for k, v in meta.items() if k != "managedFields"}
            body = {**body, "metadata": meta}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        old = self.jobs.get(key)
        if old is not None and (old.get("metadata") or {}).get("uid") == meta.get("uid"):
            a, b = _rv(old), _rv(body)
            if a is not None and b is not None and b < a:
                return key  # an older event than what we already hold (our own write's response)
        self.jobs[key] = body
        return key

    def _validate(self, key: Key, body: dict[str, Any]) -> validation.ValidationResult:
        meta = body.get("metadata") or {}
        sig = (meta.get("uid"), meta.get("generation"), repr(sorted((meta.get("labels") or {}).items())))
        hit = self._vcache.get(key)
        if hit is not None and hit[0] == sig:
            self._vcache.move_to_end(key)
            return hit[1]
        doc = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
        doc["metadata"] = {k: v for k, v in meta.items() if k in ("name", "namespace", "labels", "annotations", "uid")}
        res = validation.validate(doc)
        self._vcache[key] = (sig, res)
        self._vcache.move_to_end(key)
        while len(self._vcache) > VALIDATION_CACHE_SIZE:
            self._vcache.popitem(last=False)
        return res

    def observed_pods(self, key: Key, job_uid: str) -> list[lifecycle.PodInfo]:
        pods = [info for info, _ in self.pods.of(key)] if self.pods is not None else []
        return self.expectations.observed(key, pods, job_uid)

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, key: Key) -> None:
        body = self.jobs.get(key)
        if body is None or self.kube is None or self.pods is None or not self.pods.synced:
            return  # every job is kicked once the pods are listed
        self.stats["reconciles"] += 1
        ns, name = key
        meta = body.get("metadata") or {}
        uid = meta.get("uid", "")
        res = self._validate(key, body)
        view = lifecycle.JobView.from_body(body, res)
        pods = self.observed_pods(key, uid)
        dec = lifecycle.decide(view, pods, lifecycle.now_utc(), self.config.policy)
        k = self.kube

        # 1. status first when the decision deletes anything: a gang restart must never run on an unrecorded
        #    decision. Creations carry their attempt in the pods themselves, so they may go in parallel.
        creating = bool(dec.create_pods and dec.create_attempt is not None)
        destructive = bool(dec.delete_pods or dec.delete_job)
        create_task = None
        if creating and not destructive:
            create_task = asyncio.get_running_loop().create_task(
                self._create(key, body, res, dec.create_attempt, dec.create_pods,  # type: ignore[arg-type]
                             dec.kueue_group))
            creating = False
        try:
            if dec.status is not None:
                old = lifecycle.clean_status(view.status)
                carried = self.progress.carry(key, old, dec.status)
                patch = progress_mod.fix_progress_patch(lifecycle.status_patch(old, dec.status), old)
                if patch:
                    try:
                        async with self._sem:
                            resp = await k.patch_status("GRPOJob", ns, name, patch)
                    except kube.NotFound:
                        self.forget(key)
                        return
                    self.stats["status_writes"] += 1
                    carried = carried and "progress" in patch
                    opmetrics.STATUS_WRITES.labels(progress="true" if carried else "false").inc()
                    if carried:
                        self.progress.written(key)
                    new_restarts = int(dec.status.get("restarts") or 0)
                    if dec.status.get("phase") == Phase.RESTARTING and new_restarts > int(old.get("restarts") or 0):
                        opmetrics.RESTARTS.labels(reason=str(dec.status.get("lastFailureReason") or "Unknown")).inc()
                    if isinstance(resp, dict) and (resp.get("metadata") or {}).get("uid") == uid:
                        self.observe_job(resp)
        finally:
            if create_task is not None:
                await create_task
        # 2. events (best effort)
        for ev in dec.events:
            self.events.record(body, ev)
        # 3. deletions
        if dec.delete_job:
            await k.delete("GRPOJob", ns, name, propagation="Background", uid=uid)
            return
        uids = {p.name: p.uid for p in pods}
        now = time.monotonic()
        dels = []
        for pod in dec.delete_pods:
            if self.expectations.delete_due((ns, pod), 5.0, now):
                dels.append(self._delete_pod(ns, pod, uids.get(pod)))
        for pod, why in dec.force_delete_pods:  # decide() repeats these until the pod is gone: one event per send
            if self.expectations.delete_due((ns, pod, "force"), 30.0, now):
                self.events.record(body, lifecycle.JobEvent("Warning", "ForceDeleted", why))
                dels.append(self._delete_pod(ns, pod, uids.get(pod), grace_seconds=0))
        for pod in dec.end_kueue_groups:  # decide() repeats these until the pods show the annotation
            if self.expectations.delete_due((ns, pod, "unretriable"), 5.0, now):
                dels.append(self._end_kueue_group(ns, pod))
        if dels:
            await asyncio.gather(*dels)
        # 4. creations
        if creating:
            await self._create(key, body, res, dec.create_attempt, dec.create_pods,  # type: ignore[arg-type]
                               dec.kueue_group)
        if dec.requeue_after is not None:
            self.kick_later(key, dec.requeue_after + 0.05)

    async def _delete_pod(self, ns: str, name: str, uid: Optional[str], grace_seconds: Optional[int] = None) -> None:
        assert self.kube is not None
        try:
            async with self._sem:
                await self.kube.delete("Pod", ns, name, uid=uid, grace_seconds=grace_seconds)
            self.stats["deletes"] += 1
        except kube.Conflict:  # uid precondition failed: a newer pod of that name; leave it
            pass

    async def end_kueue_groups_of_deleted_job(self, key: Key, body: dict[str, Any]) -> None:
        """A job deleted at once (no finalizer of ours to wait on): its pods are still listed; end their Kueue
        groups so that Kueue releases the quota instead of waiting for replacement pods (best effort)."""
        if self.pods is None or self.kube is None:
            return
        view = lifecycle.JobView.from_body(body)
        for pod in lifecycle.decision.deleted_job_groups(view, [info for info, _ in self.pods.of(key)]):
            await self._end_kueue_group(key[0], pod)

    async def _end_kueue_group(self, ns: str, pod: str) -> None:
        """kueue.x-k8s.io/retriable-in-group: "false" on one pod ends its Kueue pod group: Kueue finishes the
        Workload once none of the group's pods runs, releases the quota and removes its finalizers."""
        assert self.kube is not None
        try:
            async with self._sem:
                await self.kube.patch("Pod", ns, pod, {"metadata": {"annotations": {
                    gang_names.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION: gang_names.KUEUE_RETRIABLE_IN_GROUP_FALSE}}})
        except kube.NotFound:
            pass
        except kube.ApiError as exc:
            log.warning("cannot end the Kueue pod group of pod %s/%s (%s); the operator needs patch on pods "
                        "(chart: rbac.kueue=true)", ns, pod, exc)

    async def _create(self, key: Key, body: dict[str, Any], res: validation.ValidationResult, attempt: int,
                      pod_names: list[str], kueue_group: Optional[str] = None) -> None:
        assert self.kube is not None and res.job is not None and res.topology is not None
        ns, name = key
        uid = (body.get("metadata") or {}).get("uid", "")
        objs = manifests.render(res.job, res.topology, ns, uid=uid, image=self.config.image, attempt=attempt,
                                metrics_port=self.config.trainer_metrics_port, kueue_group=kueue_group)
        wanted = set(pod_names)
        support = [o for o in objs if o["kind"] != "Pod"]
        pods = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["name"] in wanted]
        for o in pods:  # render() annotates trainer pods only; the vLLM server pod belongs to the attempt too
            o["metadata"].setdefault("annotations", {})[manifests.ANNOTATION_ATTEMPT] = str(attempt)
        results = await asyncio.gather(*(self._create_one(key, uid, o, body) for o in support))
        if not all(results):
            return  # a ConfigMap/Service/PodGroup of ours is missing or owned by something else: pods would use the wrong one
        self.expectations.created(key, [p["metadata"]["name"] for p in pods], attempt)
        await asyncio.gather(*(self._create_one(key, uid, o, body) for o in pods))

    async def _create_one(self, key: Key, uid: str, obj: dict[str, Any], job: Optional[dict[str, Any]] = None) -> bool:
        assert self.kube is not None
        kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            async with self._sem:
                await self.kube.create(obj)
            self.stats["creates"] += 1
            return True
        except kube.Conflict:
            pass  # AlreadyExists (or our own ambiguous earlier write): ours is success
        except kube.ApiError as exc:
            if kind not in kube.GROUP_PLURALS or exc.status not in (403, 404):
                refused.report(self, key, obj, exc, job)  # a FailedCreate Event with the server's message
                raise
            # the gang scheduler's CRD is not installed, or the operator may not create PodGroups: no pods (the
            # scheduler would refuse them, or schedule them one by one); say so, and try again later
            why = (f"cannot create {obj['apiVersion']} {kind} {name} for spec.scheduling.gang ({exc.status} "
                   f"{exc.reason}): install the scheduler's PodGroup CRD and grant the operator podgroups "
                   f"(chart: rbac.podGroups=true); the pods are created once it exists")
            log.warning("%s/%s: %s", ns, key[1], why)
            if job is not None and self.expectations.delete_due((ns, name, "pod-group-event"), 300.0):
                self.events.record(job, lifecycle.JobEvent("Warning", "PodGroupNotCreated", why))
            self.kick_later(key, 30.0)
            return False
        try:
            async with self._sem:
                existing = await self.kube.get(kind, ns, name, api_version=obj.get("apiVersion"))
        except kube.NotFound:
            self.kick_later(key, 0.5)  # it was being deleted; try again
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
        self.kick_later(key, 0.2)
        return False

    async def _send_event(self, namespace: str, event: dict[str, Any]) -> None:
        if self.kube is not None:
            await self.kube.post_event(namespace, event)


async def _login(**kwargs: Any) -> Any:
    info = None
    try:
        info = kopf.login_with_service_account(**kwargs)
    except Exception:
        info = None
    if info is None:
        info = kopf.login_with_kubeconfig(**kwargs)
    return info


def register(registry: kopf.OperatorRegistry, controller: Controller) -> None:
    """Register the controller's handlers (and the login) on a fresh registry."""
    cfg = controller.config

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> Any:
        info = await _login(**kwargs)
        if info is not None:
            if controller.kube is not None:
                await controller.kube.close()
            controller.kube = kube.Kube(info, relogin=lambda: _login(logger=log), limit=cfg.max_concurrent_writes)
        return info

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await controller.close()

    if not cfg.controller:
        return
    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry)
    async def job_event(event: Any, body: Any, **_: Any) -> None:
        if not ha.admit_event(controller.gate, event, body):
            return
        controller.ensure_background()
        # The decoded event is kopf's and is never modified after the event (by kopf or by us): keep it as it is
        # (observe_job drops managedFields) instead of deep-copying ~1000 objects per burst.
        raw = dict(body)
        meta = raw.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event.get("type") == "DELETED":
            await controller.end_kueue_groups_of_deleted_job(key, raw)
            controller.forget(key)
            return
        controller.observe_job(raw)
        controller.kick(key)


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf deep-copies every object on every event to diff it for on.create/on.update handlers. We register
    none (event handlers + indices only), so the diff is never read: skipping it saved ~25 % of the operator's
    CPU at 1000 jobs (py-spy). Nothing is stored on the objects either."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> Any:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


def settings_for(cfg: Settings) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.scanning.disabled = not cfg.scanning
    settings.posting.level = logging.WARNING
    # kopf keeps a worker (task, queue, latest body) per object for idle_timeout after its last event (default 5 s):
    # in a burst of 1000 jobs that is thousands of live workers, a peak the process never gives back. Our event
    # handlers only kick the reconciler, so a worker has nothing to wait for.
    settings.queueing.idle_timeout = 0.5
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    settings.persistence.finalizer = "grpo.dev/finalizer"  # only used if a handler ever needs one (none does)
    if cfg.webhook_listen:
        from ..webhook import server as webhook

        addr, port = opmetrics.parse_listen(cfg.webhook_listen)
        settings.admission.server = webhook.server(addr, port, cfg.webhook_host, cfg.webhook_cert_dir,
                                                   cfg.webhook_service)
    return settings


def build(cfg: Settings) -> tuple[kopf.OperatorRegistry, kopf.OperatorSettings, Controller]:
    registry = kopf.OperatorRegistry()
    controller = Controller(cfg)
    opmetrics.track_jobs(lambda: list(controller.jobs.values()))
    register(registry, controller)
    settings = settings_for(cfg)
    if cfg.webhook_listen:
        from ..webhook import server as webhook

        webhook.register(registry, opmetrics.count_review)
        if cfg.webhook_manage:  # our own writer of the configuration, not kopf's managed mode (webhookconfig.py)
            settings.admission.server = webhookconfig.publishing(settings.admission.server, lambda: controller.kube, cfg)
    return registry, settings, controller
