"""`kubectl grpo list` and `describe` as text: kubectl's AGE, its column tables, and describe's sections (the job,
its progress, conditions, pods and events). Pure: it formats grpo_operator.client's Job and Event, reads nothing.

It may import the standard library and grpo_operator.client (its types); nothing else of the cli.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any, Optional


def _age(ts: Optional[str], now: Optional[_dt.datetime] = None) -> str:
    """kubectl's AGE: 45s, 12m, 5h, 3d."""
    from grpo_operator.client.types import parse_time

    t = parse_time(ts)
    if t is None:
        return "-"
    secs = max(0, int(((now or _dt.datetime.now(_dt.UTC)) - t).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows)


def _reward(job: Any) -> str:
    r = job.progress.reward if job.progress else None
    return f"{r:.3f}" if isinstance(r, (int, float)) else "-"


def _step(job: Any) -> str:
    p = job.progress
    if p is None or p.step is None:
        return "-"
    return p.display or (f"{p.step}/{p.max_steps}" if p.max_steps else str(p.step))


def list_table(jobs: Sequence[Any], all_namespaces: bool, wide: bool) -> str:
    head = (["NAMESPACE"] if all_namespaces else []) + ["NAME", "PHASE", "ATTEMPT", "NODES", "STEP", "REWARD", "AGE"]
    if wide:
        head += ["TOPOLOGY", "QUEUE", "MESSAGE"]
    rows = [head]
    for j in jobs:
        row = ([j.namespace] if all_namespaces else []) + [j.name, j.phase, str(j.attempt), str(j.nodes), _step(j),
                                                             _reward(j), _age(j.creation_timestamp)]
        if wide:
            row += [j.topology or "-", j.queue or "-", (j.message or "")[:80]]
        rows.append(row)
    return _table(rows)


def describe_text(job: Any, events: Sequence[Any], notes: Optional[dict[str, str]] = None) -> str:
    notes = notes or {}
    out = _job_lines(job)
    progress = _progress_line(job)
    if progress is not None:
        out.append(progress)
    out += _condition_lines(job)
    out += _pod_lines(job, notes)
    out += _event_lines(events, notes)
    return "\n".join(out)


def _job_lines(job: Any) -> list[str]:
    """describe's first section: name, phase, why it waits, attempts, nodes, queue, times, a stale status."""
    out = [f"Name:         {job.name}", f"Namespace:    {job.namespace}", f"Phase:        {job.phase}"]
    if job.message:
        out.append(f"Message:      {job.message}")
    waiting = job.waiting_for
    if waiting:
        out.append(f"Waiting for:  {waiting}")
    requeued = f", {job.requeues} by Kueue" if job.requeues else ""
    out += [f"Attempt:      {job.attempt} (gang restarts so far{requeued})", f"Nodes:        {job.nodes}"
            + (f" ({job.topology} nodes×processes)" if job.topology else ""),
            f"Suspend:      {str(job.suspended).lower()}"]
    if job.in_place_restarts:
        out.insert(-2, f"In place:     {job.in_place_restarts} restart(s) inside the running pods (both count against "
                       "runPolicy.backoffLimit)")
    if job.queue:
        out.append(f"Queue:        {job.queue}")
    if job.last_failure_reason:
        out.append(f"Last failure: {job.last_failure_reason}")
    for label, ts in (("Created", job.creation_timestamp), ("Started", job.start_time),
                      ("Completed", job.completion_time)):
        if ts:
            out.append(f"{label + ':':<13} {ts}")
    if not job.up_to_date:
        seen = "no status yet" if job.observed_generation is None else \
            f"status is for generation {job.observed_generation}"
        out.append(f"Note:         {seen}, spec is at generation {job.generation}")
    return out


def _progress_line(job: Any) -> Optional[str]:
    p = job.progress
    if p is None:
        return None
    bits = [f"step {_step(job)}"]
    if p.reward is not None:
        bits.append(f"reward {p.reward:.4g}")
    if p.kl is not None:
        bits.append(f"kl {p.kl:.4g}")
    if p.tokens_per_second is not None:
        bits.append(f"{p.tokens_per_second:.4g} tokens/s")
    if p.eta_seconds is not None:
        bits.append(f"eta {int(p.eta_seconds)}s")
    return "Progress:     " + ", ".join(bits)


def _condition_lines(job: Any) -> list[str]:
    if not job.conditions:
        return []
    out = ["Conditions:"]
    rows = [["  TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]]
    rows += [[f"  {c.type}", c.status, c.reason or "-", _age(c.last_transition_time), c.message[:100]]
             for c in job.conditions]
    out.append(_table(rows))
    stall = next((c for c in job.conditions if c.type == "Stalled" and c.message), None)
    if stall is not None:  # whole: the stuck rank's innermost frames are at its end (docs/operator.md#stalls)
        out.append(f"Stall:        {stall.message}")
    return out


def _pod_lines(job: Any, notes: dict[str, str]) -> list[str]:
    out = ["Pods:" if job.pods else f"Pods:         <{notes.get('pods', 'none')}>"]
    if job.pods:
        rows = [["  RANK", "POD", "ATTEMPT", "PHASE", "NODE", "DETAIL"]]
        for pod in job.pods:
            rows.append([f"  {pod.rank if pod.rank is not None else pod.role}", pod.name, str(pod.attempt),
                         pod.phase + (" (deleting)" if pod.deleting else ""), pod.node_name or "-",
                         pod.detail or "-"])
        out.append(_table(rows))
    return out


def _event_lines(events: Sequence[Any], notes: dict[str, str]) -> list[str]:
    out = ["Events:" if events else f"Events:       <{notes.get('events', 'none')}>"]
    if events:
        rows = [["  TYPE", "REASON", "AGE", "OBJECT", "MESSAGE"]]
        for e in events[-20:]:
            rows.append([f"  {e.type}", e.reason, _age(e.last_time) + (f" (x{e.count})" if e.count > 1 else ""),
                         f"{e.object_kind.lower()}/{e.object_name}", e.message[:120]])
        out.append(_table(rows))
    return out
