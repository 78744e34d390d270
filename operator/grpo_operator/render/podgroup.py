"""Gang admission and gang scheduling: the PodGroup of a job and what its pods carry for Kueue, coscheduling or
Volcano (pure and deterministic; docs/scheduling.md).

* Kueue (the job has the label kueue.x-k8s.io/queue-name): the pods of a run form one Kueue pod group (label
  kueue.x-k8s.io/pod-group-name + annotation kueue.x-k8s.io/pod-group-total-count). Kueue keeps its finalizer on a
  pod it has admitted until a replacement of the group exists, so a pod of attempt k ≥ 1 is named
  <base>-node-<rank>-a<k>; its hostname and subdomain stay <base>-node-<rank> and <base>, so the rendezvous
  address never changes.
* spec.scheduling.gang = coscheduling | volcano: one PodGroup per job, named like the job's headless Service,
  owned by the job, created before the pods; minMember counts every pod that must start together (the vLLM
  server too) and minResources is the sum of their effective requests.

May import api and the standard library (render/manifests.py calls it, not the other way round).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Optional

from .. import api
from ..api import gang as g

MAX_LABEL_VALUE = 63
DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# ---------------------------------------------------------------------------------------------- which mode
def kueue_queue(job: api.GRPOJob) -> Optional[str]:
    """The job's Kueue LocalQueue (its kueue.x-k8s.io/queue-name label), or None."""
    extra = job.metadata.model_extra or {}
    labels = extra.get("labels")
    queue = labels.get(g.KUEUE_QUEUE_LABEL) if isinstance(labels, dict) else None
    return queue if isinstance(queue, str) and queue else None


def gang_of(job: api.GRPOJob) -> Optional[str]:
    """coscheduling | volcano | None (spec.scheduling.gang)."""
    scheduling = getattr(job.spec, "scheduling", None)
    return getattr(scheduling, "gang", None) if scheduling is not None else None


# ---------------------------------------------------------------------------------------------- names
def attempt_pod_name(stable: str, attempt: int, *, kueue: bool) -> str:
    """A pod's name from its stable name (its hostname, e.g. <base>-node-<rank>). Under Kueue each attempt gets new
    names (the old pods keep Kueue's finalizer until their replacements exist); otherwise the stable name."""
    return f"{stable}-a{attempt}" if kueue and attempt > 0 else stable


def kueue_group_name(base: str, uid: str, attempt: int, *, server: bool = False) -> str:
    """The Kueue pod group (and so Workload) name of the run that starts at `attempt` (`base`: the job's child
    name base): unique per job (its uid: a Workload of an older job of the same name is never matched) and per
    run, a DNS-1123 subdomain of at most 63 characters (Kueue's validation). Replacement pods of later attempts
    of the same run keep this name. `server`: the vLLM server's own group in server mode (<base>-<uid>-vllm-a<N>),
    admitted before the trainers' group is created (lifecycle/server_order.py gang_groups)."""
    ident = re.sub(r"[^a-z0-9]", "", (uid or "").lower())[:8] or hashlib.sha256(base.encode()).hexdigest()[:8]
    suffix = f"-{ident}{'-vllm' if server else ''}-a{attempt}"
    head = re.sub(r"[^a-z0-9-]", "-", base.lower())[: MAX_LABEL_VALUE - len(suffix)].strip("-") or "job"
    return head + suffix


# ---------------------------------------------------------------------------------------------- quantities
_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(10) ** 3,
            "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
            "E": Decimal(10) ** 18}
_QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


def parse_quantity(value: Any) -> tuple[Decimal, str]:
    """A Kubernetes quantity → (value in base units, 'binary' | 'decimal' | 'plain'): the format a sum keeps."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Decimal(value), "plain"
    m = _QUANTITY_RE.match(str(value).strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as e:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from e
    suffix = m.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix], "binary"
    if suffix[:1] in ("e", "E"):
        return number * (Decimal(10) ** int(suffix[1:])), "decimal"
    return number * _DECIMAL[suffix], ("decimal" if suffix not in ("", "m", "u", "n") else "plain")


def format_quantity(value: Decimal, style: str = "plain") -> str:
    """Base units → a canonical quantity string: whole numbers with the largest exact suffix of `style`,
    fractions in milli-units (rounded up: a minimum must never shrink)."""
    if value != value.to_integral_value():
        milli = (value * 1000).to_integral_value(rounding="ROUND_CEILING")
        return f"{milli}m"
    whole = int(value)
    if style == "binary":
        for suffix, factor in reversed(_BINARY.items()):
            if whole and whole % factor == 0:
                return f"{whole // factor}{suffix}"
    elif style == "decimal":
        for suffix in ("E", "P", "T", "G", "M", "k"):
            factor = int(_DECIMAL[suffix])
            if whole and whole % factor == 0:
                return f"{whole // factor}{suffix}"
    return str(whole)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, tuple[Decimal, str]]:
    """A pod's effective request, as the scheduler (and Kueue, and Kubeflow's PodGroups) count it: the sum over
    containers (a request defaults to its limit), at least the largest init container, plus the pod overhead."""
    spec = pod.get("spec") or {}

    def container_requests(c: Mapping[str, Any]) -> dict[str, tuple[Decimal, str]]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: parse_quantity(v) for k, v in merged.items()}

    total: dict[str, tuple[Decimal, str]] = {}
    for c in spec.get("containers") or []:
        for k, (v, style) in container_requests(c).items():
            old = total.get(k, (Decimal(0), style))
            total[k] = (old[0] + v, _merge_style(old[1], style))
    for c in spec.get("initContainers") or []:
        for k, (v, style) in container_requests(c).items():
            if v > total.get(k, (Decimal(0), style))[0]:
                total[k] = (v, style)
    for k, raw in (spec.get("overhead") or {}).items():
        v, style = parse_quantity(raw)
        old = total.get(k, (Decimal(0), style))
        total[k] = (old[0] + v, _merge_style(old[1], style))
    return total


def _merge_style(a: str, b: str) -> str:
    return a if a == b else ("binary" if "binary" in (a, b) else "decimal" if "decimal" in (a, b) else "plain")


def sum_requests(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Σ effective requests of `pods`, as a ResourceList of canonical quantity strings (sorted by name)."""
    total: dict[str, tuple[Decimal, str]] = {}
    for pod in pods:
        for k, (v, style) in pod_requests(pod).items():
            old = total.get(k, (Decimal(0), style))
            total[k] = (old[0] + v, _merge_style(old[1], style))
    return {k: format_quantity(v, style) for k, (v, style) in sorted(total.items()) if v > 0}


# ---------------------------------------------------------------------------------------------- objects
def _owner(job_name: str, uid: str) -> list[dict[str, Any]]:
    return [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": job_name, "uid": uid,
             "controller": True, "blockOwnerDeletion": True}] if uid else []


def pod_group(job: api.GRPOJob, pods: Sequence[Mapping[str, Any]], *, name: str, namespace: str,
              labels: Mapping[str, str], annotations: Mapping[str, str], uid: str = "") -> Optional[dict[str, Any]]:
    """The job's PodGroup for spec.scheduling.gang (None without one). `pods`: the rendered pods of one attempt,
    all of which must start together: the trainers (a vLLM server is created before them, outside the group)."""
    gang, scheduling = gang_of(job), job.spec.scheduling
    if gang is None or scheduling is None:
        return None
    job_name = job.metadata.name or ""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels),
                            "annotations": dict(annotations)}
    if uid:
        meta["ownerReferences"] = _owner(job_name, uid)
    spec: dict[str, Any] = {"minMember": len(pods)}
    resources = sum_requests(pods)
    if resources:
        spec["minResources"] = resources
    if gang == g.GANG_COSCHEDULING:
        if scheduling.scheduleTimeoutSeconds is not None:
            spec["scheduleTimeoutSeconds"] = scheduling.scheduleTimeoutSeconds
        api_version = g.COSCHEDULING_API_VERSION
    else:
        spec["queue"] = scheduling.queue or g.VOLCANO_DEFAULT_QUEUE
        priority = scheduling.priorityClassName or job.spec.template.priorityClassName
        if priority:
            spec["priorityClassName"] = priority
        api_version = g.VOLCANO_API_VERSION
    return {"apiVersion": api_version, "kind": g.POD_GROUP_KIND, "metadata": meta, "spec": spec}


def decorate_pod(pod: dict[str, Any], job: api.GRPOJob, *, pod_group_name: str, kueue_group: str,
                 total: int) -> dict[str, Any]:
    """Mark one rendered pod (in place, and return it) for its gang: Kueue's pod-group label and total count
    (`kueue_group`: the run's group, see kueue_group_name), the coscheduling PodGroup label, or Volcano's group
    annotation and scheduler. Nothing Kueue's webhook adds (gates, finalizer, managed label) is set here: a gate
    set by us would keep the pods gated forever on a cluster without Kueue."""
    meta = pod.setdefault("metadata", {})
    labels = meta.setdefault("labels", {})
    annotations = meta.setdefault("annotations", {})
    if kueue_queue(job) is not None:
        labels[g.KUEUE_GROUP_NAME_LABEL] = kueue_group
        annotations[g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION] = str(total)
    gang = gang_of(job)
    if gang == g.GANG_COSCHEDULING:
        labels[g.COSCHEDULING_POD_GROUP_LABEL] = pod_group_name
    elif gang == g.GANG_VOLCANO:
        annotations[g.VOLCANO_GROUP_NAME_ANNOTATION] = pod_group_name
        spec = pod.setdefault("spec", {})
        if not spec.get("schedulerName"):  # the user's own scheduler name (a second Volcano profile) is kept
            spec["schedulerName"] = g.VOLCANO_SCHEDULER_NAME
    return pod

