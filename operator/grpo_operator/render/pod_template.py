"""spec.template on the pods (pure): the restricted security defaults and what spec.template.securityContext and
capabilities change, envFrom, annotations, the grace period, hostNetwork and DNS, topology spread and the other
pod-level fields, the user's init containers and native sidecars, container resources, and the image a pod runs
(pick_image). render/manifests.py and render/initializer.py build their pods with these. Imports api only.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import api

RUN_AS = 1000


def pick_image(job: api.GRPOJob, gpu: bool, image: str, cpu_image: Optional[str]) -> str:
    """The image of a pod: spec.image, else the operator's CUDA image for a pod with GPUs and its CPU image for one
    without (`cpu_image` None: `image` for both)."""
    return job.spec.image or (image if gpu or cpu_image is None else cpu_image)


def pod_security(job: Optional[api.GRPOJob] = None) -> dict[str, Any]:
    """The restricted defaults, with each field spec.template.securityContext sets in place of ours."""
    ours: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}}
    asked = job.spec.template.securityContext if job is not None else None
    return {**ours, **(asked.model_dump(exclude_none=True) if asked is not None else {})}


def container_security(capabilities: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Restricted: no escalation, read-only root, every capability dropped but those spec.template.capabilities
    adds back (trainer and server containers only)."""
    caps: dict[str, Any] = {"drop": ["ALL"], **({"add": list(capabilities)} if capabilities else {})}
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": caps}


def env_from(job: api.GRPOJob) -> dict[str, Any]:
    """spec.template.envFrom on a container of ours (trainer, server, download)."""
    sources = [e.model_dump(exclude_none=True) for e in job.spec.template.envFrom]
    return {"envFrom": sources} if sources else {}


def pod_annotations(job: api.GRPOJob, meta: dict[str, Any]) -> dict[str, Any]:
    """The user's template annotations under the operator's own (which win): on every pod the job creates."""
    return {**job.spec.template.metadata.annotations, **meta["annotations"]}


def _extra_container(c: api.ExtraContainer, sidecar: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": c.name, "image": c.image}
    if sidecar:
        out["restartPolicy"] = "Always"  # a native sidecar (Kubernetes 1.29+): runs beside the containers, ends with them
    dumped = c.model_dump(exclude_none=True, exclude={"name", "image", "resources"})
    out.update({k: v for k, v in dumped.items() if v != []})
    resources = container_resources(c.resources)
    if resources:
        out["resources"] = resources
    out["securityContext"] = container_security()
    return out


NATIVE_SIDECARS_SINCE = (1, 29)  # SidecarContainers on by default (beta); older servers drop restartPolicy


def has_native_sidecars(obj: dict[str, Any]) -> bool:
    """A pod with an init container of restartPolicy Always (spec.template.sidecars)."""
    inits = (obj.get("spec") or {}).get("initContainers") or [] if obj.get("kind") == "Pod" else []
    return any(c.get("restartPolicy") == "Always" for c in inits)


def runtime_extras(job: api.GRPOJob) -> dict[str, Any]:
    """What spec.template adds to the pods that run the job (trainers and the vLLM server, not the download pod):
    hostNetwork (with cluster DNS kept: ClusterFirstWithHostNet unless dnsPolicy says otherwise), the grace period,
    the user's sidecars then init containers, all before the operator's containers."""
    t = job.spec.template
    out: dict[str, Any] = {}
    if t.hostNetwork:
        out["hostNetwork"] = True
        out["dnsPolicy"] = t.dnsPolicy or "ClusterFirstWithHostNet"  # else the rendezvous host would not resolve
    if t.terminationGracePeriodSeconds is not None:
        out["terminationGracePeriodSeconds"] = t.terminationGracePeriodSeconds
    inits = [_extra_container(c, True) for c in t.sidecars] + [_extra_container(c, False) for c in t.initContainers]
    if inits:
        out["initContainers"] = inits
    return out


def container_resources(res: api.ResourceRequirements) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if res.limits:
        out["limits"] = {k: str(v) for k, v in sorted(res.limits.items())}
    if res.requests:
        out["requests"] = {k: str(v) for k, v in sorted(res.requests.items())}
    return out


def pod_spec_extras(job: api.GRPOJob) -> dict[str, Any]:
    t = job.spec.template
    out: dict[str, Any] = {}
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "schedulerName",
                "serviceAccountName", "runtimeClassName", "imagePullSecrets", "dnsPolicy"):
        value = getattr(t, key)
        if value:
            out[key] = value
    for key in ("topologySpreadConstraints", "dnsConfig"):
        value = getattr(t, key)
        if value:
            out[key] = [v.model_dump(exclude_none=True) for v in value] if isinstance(value, list) else \
                value.model_dump(exclude_none=True)
    return out
