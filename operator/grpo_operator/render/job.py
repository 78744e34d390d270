"""render(): every object the operator creates for a job (pure and deterministic) — the operator, `grpojob render`
and the tests call this one. manifests.core_objects(), with spec.cache's download pod (render/initializer.py: one per
job, outside the gang, so in none of its groups) right after the ConfigMap it mounts and the headless Service.
A module of its own because the initializer builds on manifests' helpers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from .. import api
from ..rules import topology
from . import cache, initializer, manifests, netpol, pod_template


def render(job: api.GRPOJob, topo: topology.Topology, namespace: str, *, uid: str = "",
           image: str = manifests.DEFAULT_TRAINER_IMAGE, attempt: int = 0,
           metrics_port: int = manifests.DEFAULT_METRICS_PORT,
           groups: Optional[Mapping[str, str]] = None,
           network_policy: Optional[netpol.Access] = None, staged: Sequence[api.StagedRevision] = (),
           cpu_image: Optional[str] = None, max_restarts: Optional[int] = None) -> list[dict[str, Any]]:
    """In creation order: the job's NetworkPolicy (with `network_policy`: who else may reach the pods; None: no
    policy), ConfigMap, Service, the download pod (spec.cache with something from the Hub), the vLLM server's
    Service, the gang scheduler's objects, pods (other arguments: manifests.core_objects). `staged`: the
    commits spec.cache's staging recorded (status.stagedRevisions), which the trainer and vLLM pods load (cache.pin). The
    download pod runs the trainers' image (pod_template.pick_image): the one their nodes pull anyway."""
    objs = manifests.core_objects(job, topo, namespace, uid=uid, image=image, attempt=attempt,
                                  metrics_port=metrics_port, groups=groups, cpu_image=cpu_image,
                                  max_restarts=max_restarts)
    cache.pin(job, objs, staged)
    stage_image = pod_template.pick_image(job, bool(topo.gpu_resource), image, cpu_image)
    objs[2:2] = initializer.render_initializer(job, namespace, uid=uid, image=stage_image, metrics_port=metrics_port)
    if network_policy is not None:  # first: the pods never exist without it
        objs.insert(0, netpol.network_policy(job, namespace, network_policy, uid=uid, metrics_port=metrics_port))
    return objs


MAX_CONFIG_MAP_BYTES = 1024 * 1024  # the API server refuses a ConfigMap whose data passes 1 MiB


def oversized(objs: list[dict[str, Any]]) -> Optional[str]:
    """The first ConfigMap whose data the API server would refuse as too large (it is checked before anything is
    sent, so a job never half-exists): what to change; None when every one fits."""
    for obj in objs:
        if obj.get("kind") != "ConfigMap":
            continue
        size = sum(len(k) + len(str(v).encode()) for k, v in (obj.get("data") or {}).items())
        if size > MAX_CONFIG_MAP_BYTES:
            name = obj["metadata"]["name"]
            return (f"ConfigMap {name} would hold {size} bytes of trainer configuration, over the API server's "
                    f"{MAX_CONFIG_MAP_BYTES} (1 MiB): shorten the spec (long values in spec.training, rewards or "
                    f"the dataset's settings: move large data into a volume)")
    return None
