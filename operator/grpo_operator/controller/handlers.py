"""The reconciler (Controller): I/O only. Every decision is lifecycle.decide(); kopf's side is registration.py.

How jobs and pods are followed (and why):
  * GRPOJobs through kopf (kopf.on.event: peering, login and the webhook are kopf's too); the handler caches the
    job and *kicks* a per-job reconciler; it keeps no state in the objects (no kopf annotations, no finalizers:
    zero extra writes per job).
  * pods labelled grpo.dev/job-name through our own list + watch (podwatch.py), keyed by (namespace, job name),
    holding compact lifecycle.PodInfo summaries; a change kicks the job's reconciler. kopf's per-event machinery
    for pods cost CPU for nothing we need (measured: docs/performance.md, "operator"). No reconcile runs before every
    watched scope has been listed, so a freshly started operator never mistakes "not listed yet" for "deleted": no
    spurious gang restarts after an operator restart.
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

from .. import lifecycle
from ..api.status import Phase, Reason
from ..lifecycle import progress as progress_mod
from ..render import manifests
from ..rules import validation
from . import events, ha, kube, podwatch, refused, registration, webhookconfig
from . import metrics as opmetrics
from .creates import Creator
from .engine_probe import EngineProbes
from .expectations import Expectations
from .netpols import PolicyKeeper
from .pod_entry import pod_entry
from .ratelimit import RateLimiter
from .scraper import ProgressScraper
from .settings import Settings
from .stalls import StackDumps, StallTracker
from .workqueue import Key, WorkQueue

log = logging.getLogger("grpo_operator")

VALIDATION_CACHE_SIZE = 1024

# How long before the same request is sent again: decide() repeats it on every pass until the watch shows its effect,
# which is on the way.
DELETE_RESEND_SECONDS = 5.0  # a pod delete
FORCE_DELETE_RESEND_SECONDS = 30.0  # a grace-0 delete of a pod stuck terminating (one ForceDeleted Event per send)
RELEASE_RESEND_SECONDS = 5.0  # the patch that has a gang scheduler release a pod's group (lifecycle/gangs Release)
# When to look at a job again (the create path's retries: creates.py):
REQUEUE_SLACK_SECONDS = 0.05  # after decide()'s requeue_after, so that the timer it waits for has passed


def _rv(body: Any) -> Optional[int]:
    rv: Any = (body.get("metadata") or {}).get("resourceVersion")
    try:
        return int(rv)
    except (TypeError, ValueError):
        return None


def _starts(old: dict[str, Any], new: Optional[dict[str, Any]]) -> bool:
    """Whether a decided status records the job's start for the first time."""
    return bool(new and new.get("startTime") and not old.get("startTime"))


def _count_restart(old: dict[str, Any], new: dict[str, Any]) -> None:
    """grpo_restarts_total{reason}: once per restart, when the status write that records it goes out."""
    new_restarts = int(new.get("restarts") or 0)
    if new.get("phase") == Phase.RESTARTING and new_restarts > int(old.get("restarts") or 0):
        opmetrics.RESTARTS.labels(reason=str(new.get("lastFailureReason") or "Unknown")).inc()


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
        self.stalls = StallTracker(config.policy.stall)  # hung jobs: what the scraper saw (controller/stalls.py)
        self.stack_dumps = StackDumps(self.stalls, self.kick)
        self.progress = ProgressScraper(config.progress_interval, self.jobs, self._endpoints, self.kick,
                                        self.kick_later, self.stalls)
        self.events = events.EventRecorder(self._send_event)
        self.probes = EngineProbes(self.kick)  # server mode: a kept vLLM server's engine probe
        self.deletes = RateLimiter(DELETE_RESEND_SECONDS)
        self.force_deletes = RateLimiter(FORCE_DELETE_RESEND_SECONDS)
        self.group_ends = RateLimiter(RELEASE_RESEND_SECONDS)
        self.failed_create_events = RateLimiter(refused.EVENT_WINDOW)
        self.refused_creates: dict[Key, str] = {}  # the last refused create's message per job (refused.py)
        self._passed: dict[Key, tuple[Any, Any]] = {}  # (uid, resourceVersion) the job's last pass started from
        self.stats = {"reconciles": 0, "status_writes": 0, "creates": 0, "deletes": 0}
        self.gate = ha.Gate(config.leader_elect)  # --leader-elect: a standby acts on nothing (ha.py)
        self.creates = Creator(self, self._sem)  # the create path: render, refusals, 409s (creates.py)
        self.netpols = PolicyKeeper(config, lambda: self.kube, self._sem)  # a running job's policy kept as rendered

    def __copy__(self) -> Controller:
        # kopf shallow-copies the operator's memo for every object it watches (3000 copies at 1000 jobs); the
        # controller is shared state by design, so every object gets the one instance.
        return self

    # ------------------------------------------------------------------ scheduling
    def kick(self, key: Key) -> None:
        self.queue.kick(key)

    def kick_changed(self, key: Key) -> None:
        """A job's watch event: a pass, unless one already started from the version cached now. Our own status write's
        event is such a version (its response was cached, and the pods' events usually kick a pass before the event
        arrives): a pass on it would decide from what a pass already decided from. Everything else that feeds a
        decision (pods, timers, probes, the resync) kicks on its own."""
        body = self.jobs.get(key)
        meta = (body or {}).get("metadata") or {}
        if body is None or self._passed.get(key) != (meta.get("uid"), meta.get("resourceVersion")):
            self.kick(key)

    def kick_later(self, key: Key, delay: float) -> None:
        self.queue.kick_later(key, delay)

    def kick_all(self) -> None:
        self.queue.kick_all()

    def forget(self, key: Key) -> None:
        self.jobs.pop(key, None)
        self._vcache.pop(key, None)
        self._passed.pop(key, None)
        self.queue.forget(key)
        self.expectations.forget(key)
        self.progress.forget(key)
        self.refused_creates.pop(key, None)
        self.probes.forget(key)
        self.stalls.forget(key)
        self.stack_dumps.forget(key)
        opmetrics.forget_job(*key)
        self.netpols.forget(key)

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
        await self.probes.close()
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
        res = validation.validate(doc, self.config.limits)
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
        """One pass for one job, counted once done (grpo_operator_reconcile_passes_total)."""
        body = self.jobs.get(key)
        if body is None or self.kube is None or self.pods is None or not self.pods.synced:
            return  # every job is kicked once the pods are listed
        self.stats["reconciles"] += 1
        await self._pass(key, body)
        if key in self.jobs:  # not a job forgotten during the pass (deleted): its series is gone
            opmetrics.RECONCILE_PASSES.labels(namespace=key[0], name=key[1]).inc()

    async def _pass(self, key: Key, body: dict[str, Any]) -> None:
        """Decide, then write the status, send the deletes, create (in that order)."""
        uid = (body.get("metadata") or {}).get("uid", "")
        self._passed[key] = (uid, (body.get("metadata") or {}).get("resourceVersion"))
        res = self._validate(key, body)
        view = lifecycle.JobView.from_body(body, res)
        view.create_refused = self.refused_creates.get(key)
        view.engine_probe = self.probes.verdict(key)
        view.stage_progress = self.progress.stage_progress(key)
        view.stall = self.stalls.watch(key)
        pods = self.observed_pods(key, uid)
        dec = lifecycle.decide(view, pods, lifecycle.now_utc(), self.config.policy)
        self.probes.request(key, dec.probe_server)  # a kept vLLM server's engine probe (a read: no status first)
        self.stack_dumps.request(key, dec.dump_stacks, self._endpoints(key))  # a stalled attempt's stacks, pods kept
        k = self.kube
        assert k is not None  # reconcile() checked
        # Status first when the decision deletes anything: a gang restart must never run on an unrecorded decision.
        # Creations carry their attempt in the pods themselves, so they may go alongside the status write; except a
        # job's first ones, which go before the status that records its start (startTime, Created): a refused
        # create ends the pass there, and the retry, knowing the refusal, writes CreateFailed instead of the claim.
        creating = bool(dec.create_pods and dec.create_attempt is not None)
        create_first = creating and not (dec.delete_pods or dec.delete_job)
        if create_first and _starts(view.status, dec.status):
            await self.creates.create_decided(key, body, res, dec)
            if key in self.refused_creates:  # refused without an error raised (a ConfigMap over the size limit)
                self.kick(key)
                return
            create_first = creating = False
        create_task = asyncio.get_running_loop().create_task(self.creates.create_decided(key, body, res, dec)) \
            if create_first else None
        try:
            job_exists = await self._write_status(key, body, view, dec, uid)
        finally:
            if create_task is not None:
                await create_task
        if not job_exists:
            return
        for ev in dec.events:  # best effort, sent in the background
            self.events.record(body, ev)
        if dec.delete_job:
            await k.delete("GRPOJob", key[0], key[1], propagation="Background", uid=uid)
            return
        await self._send_deletes(key, body, dec, pods)
        if pods:  # a job with pods: its NetworkPolicy as render produces it now (netpols.py)
            await self.netpols.keep(key, uid, res)
        if creating and not create_first:
            await self.creates.create_decided(key, body, res, dec)
        if dec.requeue_after is not None:
            self.kick_later(key, dec.requeue_after + REQUEUE_SLACK_SECONDS)

    async def _write_status(self, key: Key, body: dict[str, Any], view: lifecycle.JobView, dec: lifecycle.Decision,
                            uid: str) -> bool:
        """The decided status as a merge patch of what differs (no write when nothing does), conditional on the
        resourceVersion it was decided from; False: nothing more to do in this pass (the job is gone, or it changed
        meanwhile and is decided again from its current version)."""
        if dec.status is None:
            return True
        assert self.kube is not None
        old = lifecycle.clean_status(view.status)
        carried = self.progress.carry(key, old, dec.status)
        patch = progress_mod.fix_progress_patch(lifecycle.status_patch(old, dec.status), old)
        if not patch:
            return True
        rv = (body.get("metadata") or {}).get("resourceVersion")
        try:
            async with self._sem:
                resp = await self.kube.patch_status("GRPOJob", key[0], key[1], patch, resource_version=rv)
        except kube.NotFound:
            self.forget(key)
            return False
        except kube.Conflict:
            await self._refresh(key, uid)
            return False
        self.stats["status_writes"] += 1
        carried = carried and "progress" in patch
        opmetrics.STATUS_WRITES.labels(progress="true" if carried else "false").inc()
        if carried:
            self.progress.written(key)
        _count_restart(old, dec.status)
        if isinstance(resp, dict) and (resp.get("metadata") or {}).get("uid") == uid:
            self.observe_job(resp)
        return True

    async def _refresh(self, key: Key, uid: str) -> None:
        """After a 409 on a status write (a user's edit, another replica's write): the current version into the cache
        and another pass, instead of acting on a decision made from an older one."""
        assert self.kube is not None
        try:
            async with self._sem:
                current = await self.kube.get("GRPOJob", key[0], key[1])
        except kube.NotFound:
            self.forget(key)
            return
        if (current.get("metadata") or {}).get("uid") == uid:
            self.observe_job(current)
            self.kick(key)

    async def _send_deletes(self, key: Key, body: dict[str, Any], dec: lifecycle.Decision,
                            pods: list[lifecycle.PodInfo]) -> None:
        """Pod deletes (with uid preconditions), force deletes, releases of gang groups: each at most once per its window,
        in parallel."""
        ns = key[0]
        uids = {p.name: p.uid for p in pods}
        now = time.monotonic()
        sends = []
        for pod in dec.delete_pods:
            if self.deletes.allow((ns, pod), now):
                sends.append(self._delete_pod(ns, pod, uids.get(pod)))
        for pod, why in dec.force_delete_pods:  # decide() repeats these until the pod is gone: one event per send
            if self.force_deletes.allow((ns, pod), now):
                self.events.record(body, lifecycle.JobEvent("Warning", Reason.FORCE_DELETED, why))
                sends.append(self._delete_pod(ns, pod, uids.get(pod), grace_seconds=0))
        for pod in dec.release_pods:  # decide() repeats these until the pods show the mark
            if self.group_ends.allow((ns, pod), now):
                sends.append(self._release_group(ns, pod, dec.release))
        if sends:
            await asyncio.gather(*sends)

    async def _delete_pod(self, ns: str, name: str, uid: Optional[str], grace_seconds: Optional[int] = None) -> None:
        assert self.kube is not None
        try:
            async with self._sem:
                await self.kube.delete("Pod", ns, name, uid=uid, grace_seconds=grace_seconds)
            self.stats["deletes"] += 1
        except kube.Conflict:  # uid precondition failed: a newer pod of that name; leave it
            pass

    async def release_deleted_job(self, key: Key, body: dict[str, Any]) -> None:
        """A job deleted at once (no finalizer of ours to wait on): its pods are still listed. Release their gang
        groups (so that the scheduler frees the quota instead of waiting for replacement pods), then delete them
        ourselves rather than wait for the garbage collector (best effort: the collector remains the backstop)."""
        if self.pods is None or self.kube is None:
            return
        view = lifecycle.JobView.from_body(body)
        pods = [info for info, _ in self.pods.of(key)]
        dec = lifecycle.decision.deleted_job(view, pods)
        for pod in dec.release_pods:
            await self._release_group(key[0], pod, dec.release)
        uids = {p.name: p.uid for p in pods}
        names = [n for n in dec.delete_pods if self.deletes.allow((key[0], n))]
        if names:
            log.info("%s/%s deleted: deleting its pods %s", key[0], key[1], ", ".join(names))
        await asyncio.gather(*(self._delete_pod(key[0], n, uids.get(n)) for n in names), return_exceptions=True)

    async def _release_group(self, ns: str, pod: str, release: Optional[lifecycle.gangs.Release]) -> None:
        """The job's gang scheduler's mark on one pod, which ends its group (lifecycle/gangs: e.g. the scheduler
        finishes the group once none of its pods runs, releases the quota and removes its finalizers)."""
        assert self.kube is not None
        if release is None:
            return
        try:
            async with self._sem:
                await self.kube.patch("Pod", ns, pod, dict(release.patch))
        except kube.NotFound:
            pass
        except kube.ApiError as exc:
            log.warning(release.refused.format(pod=f"{ns}/{pod}", error=exc))

    async def _send_event(self, namespace: str, event: dict[str, Any]) -> None:
        if self.kube is not None:
            await self.kube.post_event(namespace, event)


def build(cfg: Settings) -> tuple[kopf.OperatorRegistry, kopf.OperatorSettings, Controller]:
    """The operator: a kopf registry with the controller's handlers (and the webhook's), kopf's settings, and the
    controller."""
    registry = kopf.OperatorRegistry()
    controller = Controller(cfg)
    opmetrics.track_jobs(lambda: list(controller.jobs.values()))
    registration.register(registry, controller)
    settings = registration.settings_for(cfg)
    if cfg.webhook_listen:
        from ..webhook import server as webhook

        webhook.serve_directly(settings.admission.server, webhook.register(registry, opmetrics.count_review, cfg.limits))
        if cfg.webhook_manage:  # our own writer of the configuration, not kopf's managed mode (webhookconfig.py)
            settings.admission.server = webhookconfig.publishing(settings.admission.server, lambda: controller.kube, cfg)
    return registry, settings, controller
