"""GRPOClient: the GRPOJob API through the official `kubernetes` client (CustomObjectsApi for the jobs, CoreV1Api
for pods, logs and events, watch.Watch for waiting). Each client has its own ApiClient and Configuration, so
several clients for several clusters can live in one process."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional, Union

from . import _contract as c
from . import dryrun, podlogs
from . import inputs as _inputs
from . import logs as _logs
from .dryrun import DryRunReport
from .errors import (
    InvalidJob,
    JobExists,
    JobFailed,
    JobNotFound,
    UnreachableStatus,
    WaitTimeout,
    api_error,
)
from .history import History
from .inputs import JobInput
from .kubeconfig import load_config
from .podlogs import PodLogSource
from .types import FAILURE_PHASES, PHASES, TERMINAL_PHASES, Event, Job, LogLine, Progress

Callback = Callable[[Job], Any]


class GRPOClient:
    """Submit, read, follow and steer GRPOJobs.

    namespace: default namespace of every call (default: the kube-config context's namespace, in a pod the pod's
    own, else "default"). context / config_file: a kube-config context / file (default: $KUBECONFIG or
    ~/.kube/config, else the in-cluster service account). client_configuration: a ready
    kubernetes.client.Configuration (then context and config_file are not used)."""

    def __init__(self, namespace: Optional[str] = None, context: Optional[str] = None,
                 config_file: Optional[str] = None, client_configuration: Any = None):
        from kubernetes import client as k8s

        self._k8s = k8s
        cfg, default_ns = (client_configuration, None) if client_configuration is not None else \
            load_config(context, config_file)
        self.namespace: str = namespace or default_ns or "default"
        self.api_client = k8s.ApiClient(configuration=cfg)
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.core = k8s.CoreV1Api(self.api_client)

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> GRPOClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ raw calls
    def _ns(self, namespace: Optional[str]) -> str:
        return namespace or self.namespace

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, not_found: Optional[tuple[str, str]] = None,
              **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and not_found is not None:
                raise JobNotFound(*not_found) from None
            raise api_error(exc, what) from None
        except (OSError, HTTPError) as exc:  # connection refused, TLS, DNS, retries exhausted
            raise api_error(exc, what) from None

    def _get_body(self, name: str, namespace: str) -> dict[str, Any]:
        return self._call(f"get grpojob {namespace}/{name}", self.custom.get_namespaced_custom_object,
                          c.GROUP, c.VERSION, namespace, c.PLURAL, name, not_found=(namespace, name))

    def _pod_list(self, name: str, namespace: str, rank: Optional[int] = None,
                  trainers_only: bool = True) -> tuple[list[dict[str, Any]], str]:
        """The job's pods (by label; the caller checks owners) and the list's resourceVersion (to watch from)."""
        selector = f"{c.LABEL_JOB}={c.names(name).base}"
        if trainers_only:
            selector += f",{c.LABEL_ROLE}={c.ROLE_TRAINER}"
        if rank is not None:
            selector += f",{c.LABEL_RANK}={rank}"
        resp = self._call(f"list pods of {namespace}/{name}", self.core.list_namespaced_pod, namespace,
                          label_selector=selector, _preload_content=False)
        doc = json.loads(resp.data)
        return doc.get("items") or [], str((doc.get("metadata") or {}).get("resourceVersion") or "")

    # ------------------------------------------------------------------------------------------ create
    def validate_job(self, job: JobInput, name: Optional[str] = None, namespace: Optional[str] = None,
                     labels: Optional[Mapping[str, str]] = None, queue: Optional[str] = None) -> dict[str, Any]:
        """The body create_job would send, after the webhook's own validator accepted it (else InvalidJob)."""
        body, source = _inputs.body_from(job, name)
        meta = body.setdefault("metadata", {}) if isinstance(body.get("metadata", {}), dict) else None
        if meta is None:
            raise InvalidJob([("metadata", "must be a mapping")], source)
        if name:
            meta["name"] = name
        if meta.get("namespace") and namespace and meta["namespace"] != namespace:
            raise InvalidJob([("metadata.namespace", f"the manifest says {meta['namespace']!r} but namespace "
                                                     f"{namespace!r} was asked for; drop one of them")], source)
        meta["namespace"] = meta.get("namespace") or self._ns(namespace)
        if labels or queue:
            meta["labels"] = {**(meta.get("labels") or {}), **(labels or {}),
                              **({c.QUEUE_LABEL: queue} if queue else {})}
        result = c.validate(body)
        if not result.valid:
            raise InvalidJob([(e.field, e.message) for e in result.errors], source)
        return body

    def create_job(self, job: JobInput, name: Optional[str] = None, namespace: Optional[str] = None,
                   labels: Optional[Mapping[str, str]] = None, queue: Optional[str] = None) -> Job:
        """Create a GRPOJob from a dict (a whole manifest, or a bare spec with `name`), a YAML file (one document)
        or an api.GRPOJob / api.GRPOJobSpec. It is validated here first with the webhook's own validator, so an
        invalid spec raises InvalidJob (with every field error and its fix) and never reaches the server.
        queue: the Kueue LocalQueue (label kueue.x-k8s.io/queue-name)."""
        return Job.from_dict(self._create(self.validate_job(job, name, namespace, labels, queue)))

    def _create(self, body: dict[str, Any], dry_run: Optional[str] = None) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        ns, jname = body["metadata"]["namespace"], body["metadata"]["name"]
        kw: dict[str, Any] = {"dry_run": dry_run} if dry_run else {}
        try:
            return self.custom.create_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL, body, **kw)
        except ApiException as exc:
            if exc.status == 409:
                raise JobExists(ns, jname) from None
            err = api_error(exc, f"create grpojob {ns}/{jname}")
            if exc.status in (400, 422) or "denied the request" in str(err):
                raise InvalidJob([("", str(err))], server=True) from None
            raise err from None
        except (OSError, HTTPError) as exc:
            raise api_error(exc, f"create grpojob {ns}/{jname}") from None

    def dry_run_job(self, job: JobInput, name: Optional[str] = None, namespace: Optional[str] = None,
                    labels: Optional[Mapping[str, str]] = None, queue: Optional[str] = None,
                    image: Optional[str] = None) -> DryRunReport:
        """create_job with the API server's dry run (dryRun=All) for the job and for every object the operator
        would create for it (`grpojob render`'s: NetworkPolicy, ConfigMap, Services, pods, PodGroup), so quota,
        PodSecurity, policy engines and a missing PriorityClass answer before any pod exists; nothing is created.
        The job's own refusal raises as in create_job; each object's is in the report (`refused`). image: the
        trainer image the operator is configured with (default: its default). Each object is checked alone: a quota
        that fits one pod but not all of them is not seen."""
        return dryrun.dry_run_job(self, job, name, namespace, labels, queue, image)

    # ------------------------------------------------------------------------------------------ read
    def get_job(self, name: str, namespace: Optional[str] = None, pods: bool = True) -> Job:
        """The job, with its pods (every attempt still present) unless pods=False. JobNotFound if absent."""
        ns = self._ns(namespace)
        body = self._get_body(name, ns)
        return Job.from_dict(body, self._pod_list(name, ns)[0] if pods else None)

    def list_jobs(self, namespace: Optional[str] = None, all_namespaces: bool = False,
                  label_selector: Optional[str] = None) -> list[Job]:
        kw: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        if all_namespaces:
            doc = self._call("list grpojobs", self.custom.list_cluster_custom_object, c.GROUP, c.VERSION, c.PLURAL, **kw)
        else:
            ns = self._ns(namespace)
            doc = self._call(f"list grpojobs in {ns}", self.custom.list_namespaced_custom_object,
                             c.GROUP, c.VERSION, ns, c.PLURAL, **kw)
        jobs = [Job.from_dict(item) for item in doc.get("items") or []]
        return sorted(jobs, key=lambda j: (j.namespace, j.name))

    def get_job_progress(self, name: str, namespace: Optional[str] = None) -> Optional[Progress]:
        """status.progress (step, maxSteps, reward, …, as global rank 0 of the trainer last reported), or None."""
        return self.get_job(name, namespace, pods=False).progress

    def get_job_events(self, name: str, namespace: Optional[str] = None) -> list[Event]:
        """Events of the job and of its pods (all attempts: pods keep their names across attempts), oldest first."""
        ns = self._ns(namespace)
        job = self.get_job(name, ns, pods=False)
        n = c.names(name)
        pod_names = {n.pod(r) for r in range(job.nodes)} | {n.vllm_pod(i) for i in range(4)}
        out = []
        for kind, keep in ((c.KIND, lambda ev: (ev.get("involvedObject") or {}).get("name") == name),
                           ("Pod", lambda ev: (ev.get("involvedObject") or {}).get("name") in pod_names)):
            selector = f"involvedObject.kind={kind}" + (f",involvedObject.name={name}" if kind == c.KIND else "")
            resp = self._call(f"list events of {ns}/{name}", self.core.list_namespaced_event, ns,
                              field_selector=selector, _preload_content=False)
            out += [Event.from_dict(ev) for ev in json.loads(resp.data).get("items") or [] if keep(ev)]
        return sorted(out, key=lambda e: (e.last_time or e.first_time or "", e.object_name))

    # ------------------------------------------------------------------------------------------ steer
    def _patch_spec(self, name: str, namespace: Optional[str], patch: dict[str, Any], what: str) -> Job:
        ns = self._ns(namespace)
        body = self._call(f"{what} grpojob {ns}/{name}", self.custom.patch_namespaced_custom_object,
                          c.GROUP, c.VERSION, ns, c.PLURAL, name, patch,
                          _content_type="application/merge-patch+json", not_found=(ns, name))
        return Job.from_dict(body)

    def suspend_job(self, name: str, namespace: Optional[str] = None) -> Job:
        """spec.runPolicy.suspend = true: the operator deletes the pods (phase Suspended); resume_job recreates
        them and training resumes from the latest checkpoint in spec.output."""
        return self._patch_spec(name, namespace, {"spec": {"runPolicy": {"suspend": True}}}, "suspend")

    def resume_job(self, name: str, namespace: Optional[str] = None) -> Job:
        return self._patch_spec(name, namespace, {"spec": {"runPolicy": {"suspend": False}}}, "resume")

    def delete_job(self, name: str, namespace: Optional[str] = None, wait: bool = False, timeout: float = 300) -> None:
        """Delete the job; its pods, Service and ConfigMap go with it (owner references). wait=True: foreground
        deletion, and return only once the job and its pods are gone (WaitTimeout after `timeout` seconds)."""
        ns = self._ns(namespace)
        opts = {"propagationPolicy": "Foreground" if wait else "Background"}
        before = self._get_body(name, ns) if wait else None
        self._call(f"delete grpojob {ns}/{name}", self.custom.delete_namespaced_custom_object,
                   c.GROUP, c.VERSION, ns, c.PLURAL, name, body=opts, not_found=(ns, name))
        if not wait:
            return
        uid = ((before or {}).get("metadata") or {}).get("uid")
        deadline = time.monotonic() + timeout
        selector = f"{c.LABEL_JOB}={c.names(name).base}"
        while True:
            try:
                body: Optional[dict[str, Any]] = self._get_body(name, ns)
            except JobNotFound:
                body = None
            job_gone = body is None or (body.get("metadata") or {}).get("uid") != uid  # a new job of that name
            items, rv = self._pod_list(name, ns, trainers_only=False)
            ours = [p for p in items if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]
            if job_gone and not ours:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"grpojob {ns}/{name} still exists{' (and ' + str(len(ours)) + ' pod(s))' if ours else ''}"
                                  f" {timeout:g}s after its deletion")
            # the next pod change (from this list on), or 2 s: the job's own removal comes with no pod event
            self._watch_once(self.core.list_namespaced_pod, min(left, 2), ns, label_selector=selector,
                             resource_version=rv)

    @staticmethod
    def _watch_once(func: Callable[..., Any], timeout: float, *args: Any, **kwargs: Any) -> None:
        """Block until the first watch event (or `timeout`). Any event counts, ERROR (410 Gone) included: the caller
        looks again. The raw response is read, so no model is built and no client-version-specific option is used."""
        if not kwargs.get("resource_version"):
            kwargs.pop("resource_version", None)
        resp = None
        try:
            resp = func(*args, watch=True, timeout_seconds=max(1, int(timeout)), _preload_content=False,
                        _request_timeout=timeout + 5, **kwargs)
            for chunk in resp.stream(4096):
                if chunk:
                    break
        except Exception:
            time.sleep(min(0.5, timeout))
        finally:
            if resp is not None:
                resp.close()
                resp.release_conn()

    # ------------------------------------------------------------------------------------------ wait
    def wait_for_job_status(self, name: str, status: Union[str, Iterable[str]] = ("Succeeded",),
                            timeout: float = 600, callbacks: Union[None, Callback, Sequence[Callback]] = None,
                            namespace: Optional[str] = None) -> Job:
        """Block until the job's phase is one of `status` and return the job.

        JobFailed (a RuntimeError) when the job Failed or was Rejected and that is not in `status`;
        UnreachableStatus when it Succeeded instead, or was deleted; WaitTimeout (a TimeoutError) after `timeout`
        seconds; ValueError for a status that is no phase. callbacks(job) run on every change seen."""
        wanted = {status} if isinstance(status, str) else set(status)
        bad = sorted(s for s in wanted if s not in PHASES)
        if not wanted or bad:
            raise ValueError(f"status must be phases among {', '.join(PHASES)}; got {', '.join(bad) or 'nothing'}")
        cbs: list[Callback] = [] if callbacks is None else [callbacks] if callable(callbacks) else list(callbacks)
        ns = self._ns(namespace)
        deadline = time.monotonic() + timeout
        seen: Optional[str] = None
        job: Optional[Job] = None

        def judge(body: Mapping[str, Any]) -> Optional[Job]:
            nonlocal seen, job
            rv = (body.get("metadata") or {}).get("resourceVersion")
            job = Job.from_dict(body)
            if rv != seen:
                seen = rv
                for cb in cbs:
                    cb(job)
            if job.phase in wanted:
                return job
            if job.phase in FAILURE_PHASES:
                raise JobFailed(f"grpojob {ns}/{name} {job.phase}: {job.message or job.last_failure_reason or ''}"
                                .rstrip(": "), job)
            if job.phase in TERMINAL_PHASES:
                raise UnreachableStatus(f"grpojob {ns}/{name} ended {job.phase}, not {' or '.join(sorted(wanted))}",
                                        job)
            return None

        while True:
            try:
                body = self._get_body(name, ns)
            except JobNotFound:
                if job is None:
                    raise
                raise UnreachableStatus(f"grpojob {ns}/{name} was deleted while {job.phase}", job) from None
            done = judge(body)
            if done is not None:
                return done
            left = deadline - time.monotonic()
            if left <= 0:
                assert job is not None
                raise WaitTimeout(f"grpojob {ns}/{name} is {job.phase}, not {' or '.join(sorted(wanted))}, "
                                  f"after {timeout:g}s", job)
            done = self._watch_job(name, ns, (body.get("metadata") or {}).get("resourceVersion"), deadline, judge)
            if done is not None:
                return done

    def _watch_job(self, name: str, ns: str, rv: Optional[str], deadline: float,
                   judge: Callable[[Mapping[str, Any]], Optional[Job]]) -> Optional[Job]:
        """Watch one job from `rv` until `judge` returns a job, the deadline, or the watch ends (then None: the caller
        GETs the job again)."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        left = deadline - time.monotonic()
        w = watch.Watch()
        try:
            for ev in w.stream(self.custom.list_namespaced_custom_object, c.GROUP, c.VERSION, ns, c.PLURAL,
                               field_selector=f"metadata.name={name}", resource_version=rv,
                               timeout_seconds=max(1, int(min(left, 30))), _request_timeout=min(left, 30) + 10):
                if ev.get("type") == "DELETED":
                    break  # the caller's GET says so properly
                obj = ev.get("object")
                if ev.get("type") in ("ADDED", "MODIFIED") and isinstance(obj, dict):
                    done = judge(obj)
                    if done is not None:
                        return done
                if time.monotonic() >= deadline:
                    break
        except ApiException as exc:  # 410 Gone and friends: start again from a fresh GET
            if exc.status not in (410, 500, 503, 504):
                raise api_error(exc, f"watch grpojob {ns}/{name}") from None
        except (OSError, HTTPError):  # a dropped connection: the GET tells whether the server is there
            time.sleep(0.5)
        finally:
            w.stop()
        return None

    # ------------------------------------------------------------------------------------------ logs
    def get_job_logs(self, name: str, rank: int = 0, follow: bool = False, tail_lines: Optional[int] = None,
                     since_seconds: Optional[int] = None, attempt: Optional[int] = None,
                     namespace: Optional[str] = None, timestamps: bool = False) -> Iterator[str]:
        """The trainer log of the pod of node rank `rank`, line by line.

        rank is the node rank (label grpo.dev/node-rank, the N of <job>-node-N), NOT torch's global rank: c10d
        hands out global ranks by arrival, so global rank 0 (the one printing the GRPO_PROGRESS lines) may run in
        any pod. attempt: read that attempt's pod (default: the current one). follow=True keeps reading and, after
        a gang restart, attaches to the new attempt's pod (tail_lines / since_seconds apply to the first pod only);
        it ends when the job has finished and its last pod's log is read. LogsUnavailable when there is no pod to
        read (not created yet, gated by Kueue, unschedulable, replaced by a later attempt)."""
        for line in self.follow_job_logs(name, rank, follow, tail_lines, since_seconds, attempt, namespace):
            if line.kind == "log":
                yield f"{line.time} {line.text}" if timestamps and line.time else line.text

    def follow_job_logs(self, name: str, rank: int = 0, follow: bool = False, tail_lines: Optional[int] = None,
                        since_seconds: Optional[int] = None, attempt: Optional[int] = None,
                        namespace: Optional[str] = None, poll: float = 2.0) -> Generator[LogLine, None, None]:
        """get_job_logs with each line's rank, attempt, pod and timestamp (LogLine), plus a LogLine of kind
        "attach" each time it starts reading a pod (after a gang restart: the new attempt's)."""
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise ValueError(f"rank must be a node rank (int), got {rank!r}")
        source = PodLogSource(self, name, self._ns(namespace), rank)
        try:
            if follow:
                yield from _logs.follow(source, name, rank, attempt, tail_lines, since_seconds, poll=poll)
            else:
                yield from _logs.read_once(source, name, rank, attempt, tail_lines, since_seconds)
        except JobNotFound:
            raise JobNotFound(source.namespace, name) from None
        finally:
            source.close()

    def get_progress_history(self, name: str, namespace: Optional[str] = None,
                             attempt: Optional[int] = None) -> History:
        """The training history (reward, per-function rewards, KL, completion length per logging step and attempt)
        from the trainer's progress lines in the logs of every attempt whose pods still exist (or of `attempt`).
        A resumed trainer re-prints its checkpoint's history, so the current attempt's log covers the earlier ones up
        to that checkpoint; History.notes says what could not be read. `kubectl grpo plot` draws it."""
        return podlogs.progress_history(self, name, self._ns(namespace), attempt)

    def follow_all_ranks(self, name: str, follow: bool = False, tail_lines: Optional[int] = None,
                         since_seconds: Optional[int] = None, attempt: Optional[int] = None,
                         namespace: Optional[str] = None) -> Iterator[LogLine]:
        """Every node rank's log, interleaved as lines arrive (one reader thread per rank)."""
        import queue

        job = self.get_job(name, namespace, pods=False)
        q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=10000)
        stop = threading.Event()

        def reader(rank: int) -> None:
            gen = self.follow_job_logs(name, rank, follow, tail_lines, since_seconds, attempt, namespace)
            try:
                for line in gen:
                    if stop.is_set():
                        break
                    q.put(("line", line))
            except Exception as exc:
                q.put(("error", exc))
            finally:
                gen.close()
                q.put(("done", rank))

        threads = [threading.Thread(target=reader, args=(r,), daemon=True, name=f"logs-rank-{r}")
                   for r in range(job.nodes)]
        for t in threads:
            t.start()
        running, errors = len(threads), []
        try:
            while running:
                kind, item = q.get()
                if kind == "line":
                    yield item
                elif kind == "error":
                    errors.append(item)
                else:
                    running -= 1
        finally:
            stop.set()
        if errors and len(errors) == len(threads):
            raise errors[0]
        for exc in errors:  # some ranks had nothing to read: say so, as lines, without hiding the others
            yield LogLine(text=str(exc), rank=-1, attempt=-1, pod="", kind="error")
