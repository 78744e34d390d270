"""GRPOClient: the GRPOJob API through the official `kubernetes` client (CustomObjectsApi for the jobs, CoreV1Api
for pods, logs and events, watch.Watch for waiting). Each client has its own ApiClient and Configuration, so
several clients for several clusters can live in one process."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from . import _contract as c
from . import logs as _logs
from .errors import ApiError, ConfigError, InvalidJob, JobExists, JobFailed, JobNotFound, UnreachableStatus, WaitTimeout
from .types import FAILURE_PHASES, PHASES, TERMINAL_PHASES, Event, Job, LogLine, NodePod, Progress

SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
MAX_FILE_BYTES = 4 * 1024 * 1024
JobInput = Union[Mapping[str, Any], str, os.PathLike, Any]
Callback = Callable[[Job], Any]


def _one_line(text: str, limit: int = 1000) -> str:
    return " ".join(text.split())[:limit]


def _api_error(exc: Exception, what: str) -> ApiError:
    """An ApiException (or a connection error) → ApiError with the server's own message, on one line."""
    status = getattr(exc, "status", 0) or 0
    if not isinstance(status, int) or not status:
        detail = _one_line(str(exc), 300) or type(exc).__name__
        return ApiError(f"{what}: cannot reach the API server: {detail}", 0, "Unreachable")
    body = getattr(exc, "body", None)
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    message, reason = "", str(getattr(exc, "reason", "") or "")
    if isinstance(body, str) and body.strip():
        try:
            doc = json.loads(body)
            message, reason = str(doc.get("message") or ""), str(doc.get("reason") or reason)
        except (ValueError, AttributeError):
            message = body
    return ApiError(f"{what}: {_one_line(message or reason) or 'HTTP ' + str(status)} (HTTP {status})", status, reason)


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
            self._load_config(context, config_file)
        self.namespace: str = namespace or default_ns or "default"
        self.api_client = k8s.ApiClient(configuration=cfg)
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.core = k8s.CoreV1Api(self.api_client)

    # ------------------------------------------------------------------------------------------ config
    @staticmethod
    def _load_config(context: Optional[str], config_file: Optional[str]) -> tuple[Any, Optional[str]]:
        from kubernetes import client as k8s
        from kubernetes import config as kconfig

        cfg = k8s.Configuration()
        files = config_file or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        have_file = any(Path(p).expanduser().is_file() for p in files.split(os.pathsep) if p)
        if config_file is not None and not have_file:
            raise ConfigError(f"kube-config {config_file} does not exist")
        if not have_file and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            try:
                kconfig.load_incluster_config(client_configuration=cfg)
            except kconfig.ConfigException as exc:
                raise ConfigError(f"in-cluster configuration: {exc}") from None
            try:
                ns = Path(SA_NAMESPACE).read_text().strip() or None
            except OSError:
                ns = None
            return cfg, ns
        if not have_file:
            raise ConfigError(f"no kube-config: {files} does not exist and this is not a pod "
                              "(set KUBECONFIG, pass --kubeconfig/config_file, or run in a cluster)")
        try:
            # `files`, not None: the kubernetes package reads $KUBECONFIG once, when it is imported
            kconfig.load_kube_config(config_file=files, context=context, client_configuration=cfg)
            contexts, active = kconfig.list_kube_config_contexts(config_file=files)
        except kconfig.ConfigException as exc:
            raise ConfigError(f"kube-config {files}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"kube-config {files}: {type(exc).__name__}: {exc}") from None
        chosen = next((x for x in contexts or [] if x.get("name") == context), None) if context else active
        ns = ((chosen or {}).get("context") or {}).get("namespace")
        return cfg, ns

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
            raise _api_error(exc, what) from None
        except (OSError, HTTPError) as exc:  # connection refused, TLS, DNS, retries exhausted
            raise _api_error(exc, what) from None

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
    def _body_from(self, job: JobInput, name: Optional[str]) -> tuple[dict[str, Any], str]:
        """The GRPOJob body from a dict (a whole GRPOJob, or a bare spec with `name`), a YAML file or an API model."""
        if isinstance(job, (str, os.PathLike)):
            return self._load_file(os.fspath(job)), os.fspath(job)
        dump = getattr(job, "model_dump", None)
        if callable(dump):  # api.GRPOJob or api.GRPOJobSpec
            data = dump(mode="json", exclude_unset=True, by_alias=True)
            if hasattr(job, "spec"):
                data["apiVersion"], data["kind"] = c.API_VERSION, c.KIND
                data.pop("status", None)
                return data, ""
            return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {}, "spec": data}, ""
        if isinstance(job, Mapping):
            body = json.loads(json.dumps(job, default=str))  # a deep copy that is plain JSON
            if "spec" not in body and "kind" not in body and "model" in body:
                body = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {}, "spec": body}
            return body, ""
        raise InvalidJob([("", f"create_job takes a dict, a YAML file path or an api model, not {type(job).__name__}")])

    @staticmethod
    def _load_file(path: str) -> dict[str, Any]:
        if path == "-":
            return GRPOClient._one_document(sys_stdin_text(), "<stdin>")
        p = Path(path)
        try:
            if p.is_dir():
                raise InvalidJob([("", "is a directory, expected a YAML file")], path)
            if p.stat().st_size > MAX_FILE_BYTES:
                raise InvalidJob([("", f"larger than {MAX_FILE_BYTES} bytes")], path)
            text = p.read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise InvalidJob([("", f"cannot read: {exc.strerror or exc}")], path) from None
        except UnicodeDecodeError as exc:
            raise InvalidJob([("", f"not UTF-8 text (byte {exc.start})")], path) from None
        return GRPOClient._one_document(text, path)

    @staticmethod
    def _one_document(text: str, source: str) -> dict[str, Any]:
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise InvalidJob([("", f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}")], source) from None
        if len(docs) != 1:
            raise InvalidJob([("", f"expected one GRPOJob document, found {len(docs)}")], source)
        if not isinstance(docs[0], dict):
            raise InvalidJob([("", f"expected a GRPOJob mapping, got {type(docs[0]).__name__}")], source)
        return docs[0]

    def validate_job(self, job: JobInput, name: Optional[str] = None, namespace: Optional[str] = None,
                     labels: Optional[Mapping[str, str]] = None, queue: Optional[str] = None) -> dict[str, Any]:
        """The body create_job would send, after the webhook's own validator accepted it (else InvalidJob)."""
        body, source = self._body_from(job, name)
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
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        body = self.validate_job(job, name, namespace, labels, queue)
        ns, jname = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            created: Any = self.custom.create_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL, body)
        except ApiException as exc:
            if exc.status == 409:
                raise JobExists(ns, jname) from None
            err = _api_error(exc, f"create grpojob {ns}/{jname}")
            if exc.status in (400, 422) or "denied the request" in str(err):
                raise InvalidJob([("", str(err))], server=True) from None
            raise err from None
        except (OSError, HTTPError) as exc:
            raise _api_error(exc, f"create grpojob {ns}/{jname}") from None
        return Job.from_dict(created)

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
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

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
            rv = (body.get("metadata") or {}).get("resourceVersion")
            w = watch.Watch()
            try:
                for ev in w.stream(self.custom.list_namespaced_custom_object, c.GROUP, c.VERSION, ns, c.PLURAL,
                                   field_selector=f"metadata.name={name}", resource_version=rv,
                                   timeout_seconds=max(1, int(min(left, 30))), _request_timeout=min(left, 30) + 10):
                    if ev.get("type") == "DELETED":
                        break  # the GET above says so properly
                    obj = ev.get("object")
                    if ev.get("type") in ("ADDED", "MODIFIED") and isinstance(obj, dict):
                        done = judge(obj)
                        if done is not None:
                            return done
                    if time.monotonic() >= deadline:
                        break
            except ApiException as exc:  # 410 Gone and friends: start again from a fresh GET
                if exc.status not in (410, 500, 503, 504):
                    raise _api_error(exc, f"watch grpojob {ns}/{name}") from None
            except (OSError, HTTPError):  # a dropped connection: the GET above tells whether the server is there
                time.sleep(0.5)
            finally:
                w.stop()

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
        source = _PodLogSource(self, name, self._ns(namespace), rank)
        try:
            if follow:
                yield from _logs.follow(source, name, rank, attempt, tail_lines, since_seconds, poll=poll)
            else:
                yield from _logs.read_once(source, name, rank, attempt, tail_lines, since_seconds)
        except JobNotFound:
            raise JobNotFound(source.namespace, name) from None
        finally:
            source.close()

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


def sys_stdin_text() -> str:
    import sys

    return sys.stdin.read()


class _PodLogSource:
    """logs.LogSource on the API server: the job with its trainer pods of one rank, pod logs, pod watch."""

    def __init__(self, client: GRPOClient, name: str, namespace: str, rank: int):
        self.client, self.name, self.namespace, self.rank = client, name, namespace, rank
        self._rv = ""
        self._responses: list[Any] = []

    def job(self) -> Optional[Job]:
        try:
            body = self.client._get_body(self.name, self.namespace)
        except JobNotFound:
            return None
        items, self._rv = self.client._pod_list(self.name, self.namespace, self.rank)
        return Job.from_dict(body, items)

    def read(self, pod: NodePod, *, follow: bool, tail_lines: Optional[int],
             since_seconds: Optional[int]) -> Iterator[tuple[Optional[str], str]]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kw: dict[str, Any] = {"container": c.TRAINER_CONTAINER, "follow": follow, "timestamps": True,
                              "_preload_content": False}
        if tail_lines is not None:
            kw["tail_lines"] = tail_lines
        if since_seconds is not None:
            kw["since_seconds"] = since_seconds
        try:
            resp: Any = self.client.core.read_namespaced_pod_log(pod.name, self.namespace, **kw)
        except ApiException as exc:
            if exc.status in (400, 404) and follow:
                return  # gone or not ready between our look and this call: the follower looks again
            raise _api_error(exc, f"logs of pod {self.namespace}/{pod.name}") from None
        self._responses.append(resp)
        buf = b""
        try:
            for chunk in resp.stream(64 * 1024, decode_content=True):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    yield _split_ts(raw.decode("utf-8", "replace"))
            if buf:
                yield _split_ts(buf.decode("utf-8", "replace"))
        except (OSError, HTTPError):
            return  # the connection dropped: the follower re-attaches from the last timestamp
        finally:
            resp.release_conn()
            self._responses.remove(resp)

    def wait(self, timeout: float) -> None:
        selector = f"{c.LABEL_JOB}={c.names(self.name).base},{c.LABEL_RANK}={self.rank}"
        self.client._watch_once(self.client.core.list_namespaced_pod, timeout, self.namespace,
                                label_selector=selector, resource_version=self._rv)

    def close(self) -> None:
        for resp in list(self._responses):
            try:
                resp.close()
            except Exception:
                pass


def _split_ts(line: str) -> tuple[Optional[str], str]:
    """'2030-01-01T00:00:00.123456789Z text' (the kubelet's timestamps=true form) → (timestamp, text)."""
    head, sep, rest = line.partition(" ")
    if sep and len(head) >= 20 and head[4:5] == "-" and head[10:11] == "T":
        return head, rest.rstrip("\r")
    return None, line.rstrip("\r")
