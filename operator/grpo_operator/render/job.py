"""render(): every object the operator creates for a job (pure and deterministic) — the operator, `grpojob render`
and the tests call this one. manifests.render's objects, with spec.cache's download pod (render/initializer.py: one
per job, outside the gang, so not in the PodGroup) right after the ConfigMap it mounts and the headless Service.
A module of its own because the initializer builds on manifests' helpers."""

from __future__ import annotations

from typing import Any, Optional

from .. import api
from ..rules import topology
from . import initializer, manifests


def render(job: api.GRPOJob, topo: topology.Topology, namespace: str, *, uid: str = "",
           image: str = manifests.DEFAULT_TRAINER_IMAGE, attempt: int = 0,
           metrics_port: int = manifests.DEFAULT_METRICS_PORT,
           kueue_group: Optional[str] = None) -> list[dict[str, Any]]:
    """In creation order: ConfigMap, Service, the download pod (spec.cache with something from the Hub), the vLLM
    server's Service, the PodGroup of spec.scheduling.gang, pods (arguments: manifests.render)."""
    objs = manifests.render(job, topo, namespace, uid=uid, image=image, attempt=attempt, metrics_port=metrics_port,
                            kueue_group=kueue_group)
    objs[2:2] = initializer.render_initializer(job, namespace, uid=uid, image=image, metrics_port=metrics_port)
    return objs
