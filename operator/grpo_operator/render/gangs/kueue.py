"""Kueue's plain-pod integration (the job has the label kueue.x-k8s.io/queue-name), render side.

The pods of a run form one Kueue pod group (label kueue.x-k8s.io/pod-group-name + annotation
kueue.x-k8s.io/pod-group-total-count). Kueue keeps its finalizer on a pod it has admitted until a replacement of the
group exists, so a pod of attempt k ≥ 1 is named <base>-node-<rank>-a<k>; its hostname and subdomain stay
<base>-node-<rank> and <base>, so the rendezvous address never changes. In server mode the vLLM server's pods form
a group of their own, admitted before the trainers' group exists. Nothing Kueue's webhook adds (gates, finalizer,
managed label) is set here: a gate set by us would keep the pods gated forever on a cluster without Kueue.

May import api, grpo_trainer.contract and the standard library.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Optional

from grpo_trainer import contract

from ... import api
from ...api import gang as g
from .base import Obj, RenderGang

MAX_LABEL_VALUE = 63
NAME = "kueue"


def queue(job: api.GRPOJob) -> Optional[str]:
    """The job's Kueue LocalQueue (its kueue.x-k8s.io/queue-name label), or None."""
    extra = job.metadata.model_extra or {}
    labels = extra.get("labels")
    value = labels.get(g.KUEUE_QUEUE_LABEL) if isinstance(labels, dict) else None
    return value if isinstance(value, str) and value else None


def group_name(base: str, uid: str, attempt: int, *, server: bool = False) -> str:
    """The Kueue pod group (and so Workload) name of the run that starts at `attempt` (`base`: the job's child
    name base): unique per job (its uid: a Workload of an older job of the same name is never matched) and per
    run, a DNS-1123 subdomain of at most 63 characters (Kueue's validation). Replacement pods of later attempts
    of the same run keep this name. `server`: the vLLM server's own group in server mode (<base>-<uid>-vllm-a<N>),
    admitted before the trainers' group is created (lifecycle/server/first.py)."""
    ident = re.sub(r"[^a-z0-9]", "", (uid or "").lower())[:8] or hashlib.sha256(base.encode()).hexdigest()[:8]
    suffix = f"-{ident}{'-vllm' if server else ''}-a{attempt}"
    head = re.sub(r"[^a-z0-9-]", "-", base.lower())[: MAX_LABEL_VALUE - len(suffix)].strip("-") or "job"
    return head + suffix


class KueueGang(RenderGang):
    def selected(self, job: api.GRPOJob) -> bool:
        return queue(job) is not None

    def decorate(self, job: api.GRPOJob, gang: Sequence[Obj], servers: Sequence[Obj], *, base: str, uid: str,
                 attempt: int, groups: Mapping[str, str]) -> None:
        trainers = groups.get(contract.ROLE_TRAINER) or group_name(base, uid, attempt)
        server = groups.get(contract.ROLE_VLLM) or group_name(base, uid, attempt, server=True)
        for pods, group in ((gang, trainers), (servers, server)):
            for pod in pods:
                meta = pod.setdefault("metadata", {})
                meta.setdefault("labels", {})[g.KUEUE_GROUP_NAME_LABEL] = group
                meta.setdefault("annotations", {})[g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION] = str(len(pods))


UNIT = KueueGang(name=NAME, attempt_names=True,
                 pass_through_labels=(g.KUEUE_QUEUE_LABEL, g.KUEUE_PRIORITY_CLASS_LABEL))
