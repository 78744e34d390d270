"""Following one node rank's trainer log across gang restarts (pure logic over a LogSource; no I/O here).

A gang restart deletes every pod of the job and, after a backoff, creates the next attempt's pods with
grpo.dev/attempt one higher (the same names <job>-node-<rank>, or <job>-node-<rank>-a<attempt> under Kueue, whose
replacements need new names). Pods are found by their labels (node rank + attempt), never by name. `kubectl logs -f`
ends when the old pod goes; the follower notices the end of the stream, waits for the pod of the job's new attempt
to start and attaches to it from its first line. A stream that ends while its pod still runs (the API server or the
network dropped it) is re-opened from the last line seen (by the kubelet's timestamps), so no line is printed
twice. It stops when the job has finished (or is deleted) and the last pod's log has been read to its end, or, when
`attempt` was given, when that attempt's pod has ended.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Optional, Protocol

from .errors import JobNotFound, LogsUnavailable
from .types import Job, LogLine, NodePod


class LogSource(Protocol):
    def job(self) -> Optional[Job]:
        """The job with its pods (every attempt still present); None once it is deleted."""

    def read(self, pod: NodePod, *, follow: bool, tail_lines: Optional[int],
             since_seconds: Optional[int]) -> Iterable[tuple[Optional[str], str]]:
        """(RFC 3339 timestamp, text) per line of the trainer container of `pod` (by name)."""

    def wait(self, timeout: float) -> None:
        """Block until the job's pods may have changed, or `timeout` seconds."""


def ts_key(ts: str) -> tuple[str, int]:
    """An order on the kubelet's RFC 3339 timestamps (nanoseconds, trailing zeros trimmed, always UTC 'Z')."""
    head, _, frac = ts.rstrip("Z").partition(".")
    digits = "".join(ch for ch in frac if ch.isdigit())[:9]
    return head, int(digits.ljust(9, "0")) if digits else 0


def _pick(job: Job, rank: int, attempt: int) -> Optional[NodePod]:
    return job.pod_for_rank(rank, attempt)


def _describe_missing(job: Job, rank: int, attempt: int) -> str:
    if rank < 0 or rank >= job.nodes:
        return f"grpojob {job.namespace}/{job.name} has node ranks 0..{job.nodes - 1}, not {rank}"
    other = sorted({p.attempt for p in job.pods if p.rank == rank})
    if other and attempt not in other:
        return (f"node rank {rank} of {job.name} has no pod of attempt {attempt} any more (pods are replaced at each "
                f"gang restart; attempts present: {', '.join(map(str, other))})")
    why = job.waiting_for or job.message
    return f"node rank {rank} of {job.name} has no pod at attempt {attempt} (job {job.phase}{': ' + why if why else ''})"


def _not_started(pod: NodePod) -> str:
    why = pod.detail or "not started yet"
    return f"pod {pod.name} (attempt {pod.attempt}) has no log yet: {pod.phase}, {why}"


def read_once(source: LogSource, name: str, rank: int, attempt: Optional[int], tail_lines: Optional[int],
              since_seconds: Optional[int]) -> Iterator[LogLine]:
    job = source.job()
    if job is None:
        raise JobNotFound("", name)
    target = job.attempt if attempt is None else attempt
    pod = _pick(job, rank, target)
    if pod is None:
        raise LogsUnavailable(_describe_missing(job, rank, target))
    if not pod.started:
        raise LogsUnavailable(_not_started(pod))
    for ts, text in source.read(pod, follow=False, tail_lines=tail_lines, since_seconds=since_seconds):
        yield LogLine(text=text, rank=rank, attempt=pod.attempt, pod=pod.name, time=ts)


def follow(source: LogSource, name: str, rank: int, attempt: Optional[int] = None, tail_lines: Optional[int] = None,
           since_seconds: Optional[int] = None, poll: float = 2.0,
           clock: Callable[[], float] = time.time) -> Iterator[LogLine]:
    """Yield the log of node rank `rank`: the current attempt's pod, then each new attempt's pod after a gang
    restart (a LogLine of kind "attach" precedes each pod's lines)."""
    from .types import parse_time

    job = source.job()
    if job is None:
        raise JobNotFound("", name)
    if rank < 0 or rank >= job.nodes:
        raise LogsUnavailable(_describe_missing(job, rank, 0))
    target = job.attempt if attempt is None else attempt
    first = True  # tail_lines / since_seconds apply to the first pod only; a new attempt is read from its start
    read_uid = ""  # the pod whose stream reached its end while the pod had ended
    attached_uid = ""
    last_ts: Optional[str] = None
    while True:
        if job is None:
            return  # deleted while we followed
        if attempt is None and job.attempt > target:
            target = job.attempt
        pod = _pick(job, rank, target)
        if pod is None or not pod.started or pod.uid == read_uid:
            if job.finished and (pod is None or pod.uid == read_uid or not pod.started):
                if not attached_uid:  # nothing was ever read: say why instead of printing nothing
                    raise LogsUnavailable(_not_started(pod) if pod is not None
                                          else _describe_missing(job, rank, target))
                return
            if attempt is not None and job.attempt > attempt and (pod is None or pod.uid == read_uid):
                return  # the attempt asked for is over
            source.wait(poll)
            job = source.job()
            continue
        tail, since = (tail_lines, since_seconds) if first else (None, None)
        if pod.uid != attached_uid:
            yield LogLine(text="", rank=rank, attempt=pod.attempt, pod=pod.name, kind="attach")
            attached_uid, last_ts = pod.uid, None
        elif last_ts is not None:
            # the stream dropped while the pod runs: re-open from the last line seen, skip what was printed
            seen = parse_time(last_ts)
            since = max(1, math.ceil(clock() - seen.timestamp()) + 1) if seen else None
        else:
            tail = None  # re-opened before any line came: from the start (nothing was printed)
        first = False
        got = False
        for ts, text in source.read(pod, follow=True, tail_lines=tail, since_seconds=since):
            got = True
            if last_ts is not None and ts is not None and ts_key(ts) <= ts_key(last_ts):
                continue
            if ts is not None:
                last_ts = ts
            yield LogLine(text=text, rank=rank, attempt=pod.attempt, pod=pod.name, time=ts)
        job = source.job()
        now = _pick(job, rank, target) if job is not None else None
        if job is None or now is None or now.uid != pod.uid or now.finished or now.deleting:
            read_uid = pod.uid  # its log is complete: wait for the next attempt (or the end of the job)
        elif not got:
            source.wait(poll)  # the stream closed at once on a running pod: do not spin
            job = source.job()
