"""The API server as a logs.LogSource: a job with the trainer pods of one rank, their logs, a pod watch; and the
progress history of a job read from its pods' logs (history.py parses)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

from . import _contract as c
from .errors import JobNotFound, api_error
from .history import History, Sample, merge, parse_line
from .types import Job, NodePod


class PodLogSource:
    """logs.LogSource on the API server: the job with its trainer pods of one rank, pod logs, pod watch."""

    def __init__(self, client: Any, name: str, namespace: str, rank: int):  # a GRPOClient (client.py imports us)
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
            raise api_error(exc, f"logs of pod {self.namespace}/{pod.name}") from None
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


def progress_history(client: Any, name: str, namespace: str, attempt: Optional[int] = None) -> History:
    """The progress and history lines of every attempt whose trainer pods still exist (or of `attempt` only): per
    attempt, node rank 0's log first, then the other ranks' until one has progress lines (global rank 0, which
    prints them, may run on any node)."""
    from .errors import GRPOClientError

    job = Job.from_dict(client._get_body(name, namespace), client._pod_list(name, namespace)[0])
    hist = History(job=name, namespace=namespace, attempt=job.attempt)
    pods = [p for p in job.pods if p.role == c.ROLE_TRAINER and p.rank is not None]
    samples: list[Sample] = []
    for a in sorted({p.attempt for p in pods}):
        if attempt is not None and a != attempt:
            continue
        tried: list[str] = []
        for pod in sorted((p for p in pods if p.attempt == a), key=lambda p: (p.rank, p.deleting)):
            if not pod.started:
                tried.append(f"{pod.name} has not started")
                continue
            try:
                source = PodLogSource(client, name, namespace, pod.rank or 0)
                got = [s for _, text in source.read(pod, follow=False, tail_lines=None, since_seconds=None)
                       if (s := parse_line(text, pod.attempt)) is not None]
            except GRPOClientError as exc:
                tried.append(str(exc))
                continue
            if got:
                samples += got
                hist.sources[a] = pod.name
                break
            tried.append(f"{pod.name}: no progress line yet")
        if a not in hist.sources:
            hist.notes.append(f"attempt {a}: " + "; ".join(tried or ["no trainer pod"]))
    hist.samples = merge(samples)
    seen = {s.attempt for s in hist.samples}
    for a in range(job.attempt + 1):
        if (attempt is None or a == attempt) and a not in seen and not any(p.attempt == a for p in pods):
            hist.notes.append(f"attempt {a}: its pods were deleted at the gang restart and no later attempt re-printed "
                              "its steps (it saved no checkpoint, or the job is not running again yet)")
        elif a in seen and a not in hist.sources:
            hist.notes.append(f"attempt {a}: steps up to the checkpoint the next attempt resumed from (re-printed by "
                              "it); steps logged after that checkpoint went with its pods")
    return hist
