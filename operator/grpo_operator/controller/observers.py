"""What the operator observes (Observers), and what one reconcile pass decides from (Observed): the reads. The writes
are writer.py's; handlers.py composes both around lifecycle.decide().

How jobs and pods are followed (and why):
  * GRPOJobs through our own list + watch (jobwatch.py): Controller.job_event caches the job here (observe_job) and
    kicks its reconciler; nothing is kept in the objects (no annotations, no finalizers: zero extra writes per job).
  * pods labelled grpo.dev/job-name through our own list + watch (podwatch.py), keyed by (namespace, job name),
    holding compact lifecycle.PodInfo summaries; a change kicks the job's reconciler. kopf's per-event machinery for
    pods cost CPU for nothing we need (measured: docs/performance.md, "operator"). No pass runs before every watched
    scope has been listed (`synced`), so a freshly started operator never mistakes "not listed yet" for "deleted": no
    spurious gang restarts after an operator restart.
  * pods it created or deleted but the watch does not show yet are expectations (expectations.py): observed_pods.
  * live progress (scraper.py): every GRPO_PROGRESS_INTERVAL_SECONDS a background task GETs /metrics of the running
    jobs' trainer pods (the pod index also holds their pod IP and `metrics` port; only the known global-rank-0 pod once
    it is found), turns the text into status.progress (lifecycle/progress.py, pure) and kicks the job's reconciler,
    which puts it into the status write (writer.py): for free when the status changes anyway, else at most once per
    interval per job.
  * hung jobs (stalls.py): the scraper's per-rank step times and heartbeats (StallTracker), the stacks a stall asks
    for (StackDumps); server mode: the kept vLLM server's engine probe (engine_probe.py). Both run when decide() asks
    (follow_up) and kick the job with their result.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from .. import lifecycle
from ..lifecycle import progress as progress_mod
from ..render import manifests
from ..rules import validation
from . import kube, podwatch
from .engine_probe import EngineProbes
from .expectations import Expectations
from .jobwatch import without_managed_fields
from .pod_entry import pod_entry
from .scraper import ProgressScraper
from .settings import Settings
from .stalls import StackDumps, StallTracker
from .workqueue import Key

# bounded: a parsed spec is ~15 KB. 1024 covers a burst of 1000 new jobs, whose second pass (after their pods appear)
# comes behind every other first pass: at 256 most of them were parsed twice.
VALIDATION_CACHE_SIZE = 1024


def _rv(body: Any) -> Optional[int]:
    rv: Any = (body.get("metadata") or {}).get("resourceVersion")
    try:
        return int(rv)
    except (TypeError, ValueError):
        return None


@dataclass
class Observed:
    """What one pass decides from: the cached job, its spec validated, its view (what the operator saw beside the
    object filled in) and its pods (the index plus the expected ones)."""

    body: dict[str, Any]
    uid: str
    res: validation.ValidationResult
    view: lifecycle.JobView
    pods: list[lifecycle.PodInfo]


class Observers:
    """The job cache, the validation cache, the pod index with the expectations, the progress scraper, the engine
    probes and the stall tracker with its stack dumps. `kube_of` gives the writer's client handle (a new login
    replaces it); `kick`, `kick_later` and `kick_all` are the work queue's."""

    def __init__(self, config: Settings, kube_of: Callable[[], Optional[kube.Kube]], kick: Callable[[Key], None],
                 kick_later: Callable[[Key, float], None], kick_all: Callable[[], None]):
        self.config, self._kube_of, self._kick, self._kick_all = config, kube_of, kick, kick_all
        self.jobs: dict[Key, dict[str, Any]] = {}
        # pod name -> (PodInfo, progress.Endpoint or None) per job; the endpoint is a trainer pod's metrics address
        self.pods: Optional[podwatch.PodWatch] = None
        self._vcache: OrderedDict[Key, tuple[Any, validation.ValidationResult]] = OrderedDict()
        self._passed: dict[Key, tuple[Any, Any]] = {}  # (uid, resourceVersion) the job's last pass started from
        self.expectations = Expectations(config.policy.expectation_ttl)
        self.stalls = StallTracker(config.policy.stall)  # hung jobs: what the scraper saw (controller/stalls.py)
        self.stack_dumps = StackDumps(self.stalls, kick)
        self.progress = ProgressScraper(config.progress_interval, self.jobs, self.endpoints, kick, kick_later,
                                        self.stalls)
        self.probes = EngineProbes(kick)  # server mode: a kept vLLM server's engine probe

    def start(self) -> None:
        """The scraper's rounds and the pod watch (once)."""
        self.progress.start()
        if self.pods is None:
            cfg = self.config
            self.pods = podwatch.PodWatch(self._kube_of, None if cfg.all_namespaces else cfg.namespaces,
                                          manifests.LABEL_JOB, pod_entry, self._pod_changed, self._kick_all)
            self.pods.start()

    async def close(self) -> None:
        await self.progress.close()
        await self.probes.close()
        if self.pods is not None:
            await self.pods.close()

    @property
    def synced(self) -> bool:
        """Every watched scope's pods listed: no pass before (every job is kicked then)."""
        return self.pods is not None and self.pods.synced

    def forget(self, key: Key) -> None:
        self.jobs.pop(key, None)
        self._vcache.pop(key, None)
        self._passed.pop(key, None)
        self.expectations.forget(key)
        self.progress.forget(key)
        self.probes.forget(key)
        self.stalls.forget(key)
        self.stack_dumps.forget(key)

    # ------------------------------------------------------------------ jobs
    def observe_job(self, body: dict[str, Any]) -> Key:
        body = without_managed_fields(body)  # a status write's response carries them too
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        old = self.jobs.get(key)
        if old is not None and (old.get("metadata") or {}).get("uid") == meta.get("uid"):
            a, b = _rv(old), _rv(body)
            if a is not None and b is not None and b < a:
                return key  # an older event than what we already hold (our own write's response)
        self.jobs[key] = body
        return key

    def changed(self, key: Key) -> bool:
        """Whether the cached version of the job is one no pass started from yet (or the job is not cached)."""
        body = self.jobs.get(key)
        meta = (body or {}).get("metadata") or {}
        return body is None or self._passed.get(key) != (meta.get("uid"), meta.get("resourceVersion"))

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

    # ------------------------------------------------------------------ a pass
    def observe(self, key: Key, body: dict[str, Any], create_refused: Optional[str]) -> Observed:
        """What a pass of job `key` decides from (`body`: the cached job; `create_refused`: the writer's record of
        its last refused create); from now on the job's watch event of this version kicks no pass (changed)."""
        uid = (body.get("metadata") or {}).get("uid", "")
        self._passed[key] = (uid, (body.get("metadata") or {}).get("resourceVersion"))
        res = self._validate(key, body)
        view = lifecycle.JobView.from_body(body, res)
        view.create_refused = create_refused
        view.engine_probe = self.probes.verdict(key)
        view.stage_progress = self.progress.stage_progress(key)
        view.stall = self.stalls.watch(key)
        return Observed(body, uid, res, view, self.observed_pods(key, uid))

    def follow_up(self, key: Key, dec: lifecycle.Decision) -> None:
        """The reads a decision asks for (no status first): a kept vLLM server's engine probe, a stalled attempt's
        stacks (its pods kept)."""
        self.probes.request(key, dec.probe_server)
        self.stack_dumps.request(key, dec.dump_stacks, self.endpoints(key))

    # ------------------------------------------------------------------ pods
    def pods_of(self, key: Key) -> list[lifecycle.PodInfo]:
        """The pod index's summaries of the job's pods (without expectations)."""
        return [info for info, _ in self.pods.of(key)] if self.pods is not None else []

    def observed_pods(self, key: Key, job_uid: str) -> list[lifecycle.PodInfo]:
        return self.expectations.observed(key, self.pods_of(key), job_uid)

    def endpoints(self, key: Key) -> list[progress_mod.Endpoint]:
        return [e for _, e in self.pods.of(key) if e is not None] if self.pods is not None else []

    def _pod_changed(self, key: Key) -> None:
        if key in self.jobs:
            self._kick(key)
