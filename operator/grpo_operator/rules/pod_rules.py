"""What the API server will check in the pods a spec renders, checked at admission (pure): spec.template, the
resources of the trainers and the vLLM server, the HF token reference, the accelerators and their bounds.

The grammar lives in rules/kube_rules.py; this module says which spec field goes through which rule."""

from __future__ import annotations

from typing import Any

from .. import api
from . import accelerators, kube_rules
from .kube_rules import Problem

# Room left in a pod's annotations for the operator's own (scrape, attempt, Kueue group; well under 1 KiB).
OPERATOR_ANNOTATION_BYTES = 4096
# Operator volumes present in every trainer and vLLM server pod, which a user's mount may name (render/manifests.py).
MOUNTABLE_OPERATOR_VOLUMES = ("tmp", "output")


def errors(spec: api.GRPOJobSpec) -> list[Problem]:
    """Every problem the API server would find in the pods of this spec, as (field, message)."""
    return (_template(spec.template) + _resources(spec) + _token(spec))


def _template(t: api.PodTemplate) -> list[Problem]:
    path = "spec.template"
    out = kube_rules.labels(t.metadata.labels, f"{path}.metadata.labels")
    out += kube_rules.annotation_map(t.metadata.annotations, f"{path}.metadata.annotations", OPERATOR_ANNOTATION_BYTES)
    out += kube_rules.labels(t.nodeSelector, f"{path}.nodeSelector")
    for i, tol in enumerate(t.tolerations):
        out += kube_rules.toleration(tol, f"{path}.tolerations[{i}]")
    for name in ("priorityClassName", "schedulerName", "serviceAccountName", "runtimeClassName"):
        value = getattr(t, name)
        if value is not None and (problem := kube_rules.dns_subdomain(value)):
            out.append((f"{path}.{name}", problem))
    for i, secret in enumerate(t.imagePullSecrets):
        if not isinstance(secret.get("name"), str) or set(secret) != {"name"}:
            out.append((f"{path}.imagePullSecrets[{i}]", f"must be {{name: <Secret name>}} (got {secret!r:.60})"))
    for i, env in enumerate(t.env):
        out += _env(env, f"{path}.env[{i}]")
    out += _volumes(t)
    if t.shmSize is not None and (problem := kube_rules.quantity(t.shmSize)):
        out.append((f"{path}.shmSize", problem))
    return out


def _env(env: api.EnvVar, path: str) -> list[Problem]:
    out = []
    if (problem := kube_rules.env_name(env.name)) is not None:
        out.append((f"{path}.name", problem))
    if env.valueFrom is not None:
        if env.value:
            out.append((path, "value and valueFrom are mutually exclusive: keep one"))
        out += kube_rules.env_value_from(env.valueFrom, f"{path}.valueFrom")
    return out


def _volumes(t: api.PodTemplate) -> list[Problem]:
    out: list[Problem] = []
    seen: set[Any] = set()
    for i, vol in enumerate(t.volumes):
        out += kube_rules.volume(vol, f"spec.template.volumes[{i}]")
        if vol.get("name") in seen:
            out.append((f"spec.template.volumes[{i}].name", f"duplicate volume name {vol.get('name')!r}"))
        seen.add(vol.get("name"))
    names = [str(v["name"]) for v in t.volumes if isinstance(v.get("name"), str)] + list(MOUNTABLE_OPERATOR_VOLUMES)
    paths: set[str] = set()
    for i, mount in enumerate(t.volumeMounts):
        out += kube_rules.volume_mount(mount, names, f"spec.template.volumeMounts[{i}]")
        mount_path = str(mount.get("mountPath", "")).rstrip("/")
        if mount_path in paths:
            out.append((f"spec.template.volumeMounts[{i}].mountPath", f"{mount_path} is mounted twice: mount paths "
                                                                      "must be unique"))
        paths.add(mount_path)
    return out


def _resources(spec: api.GRPOJobSpec) -> list[Problem]:
    out = kube_rules.resource_requirements(spec.resources.limits, spec.resources.requests, "spec.resources")
    server = spec.vllm.server
    if server is not None:
        out += kube_rules.resource_requirements(server.resources.limits, server.resources.requests,
                                                "spec.vllm.server.resources")
    return out


def _token(spec: api.GRPOJobSpec) -> list[Problem]:
    ref = spec.hfTokenSecretRef
    if ref is None:
        return []
    out = []
    if (problem := kube_rules.dns_subdomain(ref.name)) is not None:
        out.append(("spec.hfTokenSecretRef.name", problem))
    if (problem := kube_rules.config_map_key(ref.key)) is not None:
        out.append(("spec.hfTokenSecretRef.key", problem))
    return out


def accelerator_errors(spec: api.GRPOJobSpec, world_size: int, trainer_gpus: int) -> list[Problem]:
    """Accelerators of the trainers and the vLLM server that the trainer cannot drive (rules/accelerators.py)."""
    server_mode = spec.vllm.mode == "server"
    out = []
    trainer = spec.resources
    gpu_names = [n for n in (*trainer.limits, *trainer.requests) if accelerators.is_accelerator(n)]
    out += accelerators.problems(trainer.limits, trainer.requests, "spec.resources", own_image=spec.image is not None,
                                 world_size=world_size, server=server_mode,
                                 counts={n: trainer_gpus for n in gpu_names})
    server = spec.vllm.server
    if server_mode and server is not None:
        counts = {}
        for name in (*server.resources.limits, *server.resources.requests):
            value = server.resources.limits.get(name, server.resources.requests.get(name))
            q = kube_rules.parse_quantity(value)
            counts[name] = int(q) if q is not None else 0
        out += accelerators.problems(server.resources.limits, server.resources.requests, "spec.vllm.server.resources",
                                     own_image=(server.image or spec.image) is not None, world_size=world_size,
                                     server=True, counts=counts)
    return out
