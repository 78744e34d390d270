"""Child names, defined once: the job's name base, its Services and ConfigMap, and pod_name — the one function that
names a pod, for render() and the lifecycle alike."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from .. import api
from . import gangs

# Pod hostnames are DNS labels (≤ 63): "<base>-node-<rank>" with rank < 1024 needs 10 characters.
MAX_BASE = 52


@dataclass(frozen=True)
class Names:
    base: str  # a DNS-1035 label derived from the job name; also the headless Service's name
    job: str

    @property
    def service(self) -> str:
        return self.base

    @property
    def config_map(self) -> str:
        return f"{self.base}-config"

    @property
    def vllm(self) -> str:
        return f"{self.base}-vllm"

    def pod(self, rank: int) -> str:
        return f"{self.base}-node-{rank}"

    def vllm_pod(self, index: int = 0) -> str:
        return f"{self.base}-vllm-{index}"


def pod_name(job: api.GRPOJob, stable: str, attempt: int) -> str:
    """The one function that names a pod, from its stable name (its hostname: Names.pod / Names.vllm_pod): a gang
    scheduler may give every attempt its own names (render/gangs: RenderGang.attempt_names), else the stable name."""
    return gangs.pod_name(job, stable, attempt)


def pod_names(job: api.GRPOJob, nodes: int, attempt: int = 0) -> list[str]:
    """The pods of an attempt, as render() names them: the trainers by rank, then the vLLM server's."""
    n = names(job.metadata.name or "")
    stable = [n.pod(r) for r in range(nodes)] + ([n.vllm_pod(0)] if job.spec.vllm.mode == "server" else [])
    return [pod_name(job, s, attempt) for s in stable]


def names(job_name: str) -> Names:
    """Deterministic child names; a long or unusual job name is shortened with a hash suffix, never rejected."""
    cleaned = re.sub(r"[^a-z0-9-]", "-", job_name.lower()).strip("-")
    if cleaned and not cleaned[0].isalpha():
        cleaned = "j-" + cleaned
    if cleaned == job_name and len(cleaned) <= MAX_BASE:
        return Names(cleaned, job_name)
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
    head = cleaned[: MAX_BASE - 9].rstrip("-") or "job"
    return Names(f"{head}-{digest}", job_name)
