"""spec.template, the pods' template (pure): extra labels and annotations, environment, placement, volumes, the pod
securityContext, DNS, and extra init containers and sidecars (docs/pod-template.md says which pods get what).

May import pydantic, the standard library, api/base.py and api/pod.py (its pod-level parts); api/models.py embeds it
as spec.template."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from .base import (
    IMAGE_PATTERN,
    MAX_ENV,
    MAX_LIST,
    MAX_MAP,
    MAX_PULL_SECRETS,
    MAX_STR,
    MAX_TOLERATIONS,
    MAX_VOLUMES,
    Quantity,
    ResourceRequirements,
    _Model,
)
from .pod import (
    DNS1123_LABEL,
    MAX_CONTAINERS,
    MAX_GRACE_SECONDS,
    EnvFromSource,
    PodDNSConfig,
    PodSecurityContext,
    TopologySpreadConstraint,
    capability_problem,
)

# Kubernetes' grammar of an environment variable name (RE2-compatible: it also goes into the CRD as `pattern`).
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class EnvVar(_Model):
    name: Annotated[str, Field(min_length=1, max_length=256, pattern=ENV_NAME)] = Field(description="Variable name.")
    value: Optional[Annotated[str, Field(max_length=MAX_STR)]] = Field(default=None, description="Literal value.")
    valueFrom: Optional[dict[str, Any]] = Field(
        default=None, description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, …)."
    )


class TemplateMetadata(_Model):
    labels: Annotated[dict[str, Annotated[str, Field(max_length=63)]], Field(max_length=MAX_MAP)] = Field(
        default_factory=dict, description="Extra pod labels.")
    annotations: Annotated[dict[str, Annotated[str, Field(max_length=MAX_STR)]], Field(max_length=MAX_MAP)] = Field(
        default_factory=dict, description="Extra pod annotations.")
    # Keys, values and the annotations' total size follow the API server's rules: rules/kube_rules.py checks them.


K8sObject = dict[str, Any]
# the operator's own containers: an init container or sidecar may not take their names
RESERVED_CONTAINER_NAMES = ("trainer", "vllm", "stage")


class ExtraContainer(_Model):
    """An init container or sidecar (a log shipper, a volume warmer). It runs with the operator's restricted
    container securityContext (non-root, no privilege escalation, read-only root, all capabilities dropped)."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=DNS1123_LABEL)] = Field(
        description="Container name (a DNS label; not trainer, vllm or stage).")
    image: Annotated[str, Field(max_length=512, pattern=IMAGE_PATTERN)] = Field(description="Container image.")
    imagePullPolicy: Optional[Literal["Always", "IfNotPresent", "Never"]] = Field(
        default=None, description="Image pull policy.")
    command: Annotated[list[str], Field(max_length=MAX_LIST)] = Field(default_factory=list, description="Entrypoint.")
    args: Annotated[list[str], Field(max_length=MAX_LIST)] = Field(default_factory=list, description="Arguments.")
    workingDir: Optional[Annotated[str, Field(max_length=MAX_STR)]] = Field(default=None, description="Working dir.")
    env: Annotated[list[EnvVar], Field(max_length=MAX_ENV)] = Field(default_factory=list, description="Environment.")
    envFrom: Annotated[list[EnvFromSource], Field(max_length=MAX_LIST)] = Field(
        default_factory=list, description="Environment from ConfigMaps/Secrets.")
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements, description="Resources.")
    volumeMounts: Annotated[list[K8sObject], Field(max_length=MAX_VOLUMES)] = Field(
        default_factory=list, description="Mounts of the pod's volumes (spec.template.volumes, or tmp).")

    @field_validator("name")
    @classmethod
    def _not_ours(cls, v: str) -> str:
        if v in RESERVED_CONTAINER_NAMES:
            raise ValueError(f"{v!r} is the name of a container the operator adds: rename it")
        return v

    @field_validator("volumeMounts")
    @classmethod
    def _mounts(cls, v: list[K8sObject]) -> list[K8sObject]:
        for i, m in enumerate(v):
            if not isinstance(m.get("name"), str) or not str(m.get("mountPath", "")).startswith("/"):
                raise ValueError(f"volumeMounts[{i}] needs a name (a volume of the pod) and an absolute mountPath")
        return v


class PodTemplate(_Model):
    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata, description="Extra pod labels and annotations.")
    nodeSelector: Annotated[dict[str, Annotated[str, Field(max_length=63)]], Field(max_length=MAX_MAP)] = Field(
        default_factory=dict, description="Pod nodeSelector.")
    tolerations: Annotated[list[K8sObject], Field(max_length=MAX_TOLERATIONS)] = Field(
        default_factory=list, description="Pod tolerations (Kubernetes Toleration objects).")
    affinity: Optional[K8sObject] = Field(default=None, description="Pod affinity (a Kubernetes Affinity object).")
    priorityClassName: Optional[Annotated[str, Field(max_length=253)]] = Field(default=None, description="Pod priority class.")
    schedulerName: Optional[Annotated[str, Field(max_length=253)]] = Field(
        default=None, description="Scheduler (e.g. a gang scheduler).")
    serviceAccountName: Optional[Annotated[str, Field(max_length=253)]] = Field(
        default=None, description="ServiceAccount of the trainer pods.")
    runtimeClassName: Optional[Annotated[str, Field(max_length=253)]] = Field(default=None, description="Runtime class.")
    imagePullSecrets: Annotated[list[K8sObject], Field(max_length=MAX_PULL_SECRETS)] = Field(
        default_factory=list, description="Image pull secrets ({name: …}).")
    env: Annotated[list[EnvVar], Field(max_length=MAX_ENV)] = Field(
        default_factory=list, description="Extra environment variables of the trainer container.")
    volumes: Annotated[list[K8sObject], Field(max_length=MAX_VOLUMES)] = Field(
        default_factory=list, description="Extra pod volumes (Kubernetes Volume objects).")
    volumeMounts: Annotated[list[K8sObject], Field(max_length=MAX_VOLUMES)] = Field(
        default_factory=list, description="Extra mounts in the trainer container.")
    shmSize: Optional[Quantity] = Field(
        default=None,
        description="Size of the /dev/shm emptyDir (NCCL needs more than the container default). Default 16Gi with "
                    "GPUs; a vLLM server pod without GPUs gets 1Gi (vLLM's engine needs more than the 64Mi default)."
    )
    securityContext: Optional[PodSecurityContext] = Field(
        default=None, description="Pod securityContext fields replacing the operator's defaults (every pod).")
    capabilities: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=8)] = Field(
        default_factory=list, description="Linux capabilities added to the trainer and vLLM server containers: "
        "IPC_LOCK, SYS_RESOURCE, SYS_NICE.")
    envFrom: Annotated[list[EnvFromSource], Field(max_length=MAX_LIST)] = Field(
        default_factory=list, description="Environment from ConfigMaps/Secrets (trainer, server and download pods).")
    terminationGracePeriodSeconds: Optional[Annotated[StrictInt, Field(ge=0, le=MAX_GRACE_SECONDS)]] = Field(
        default=None, description="Seconds between SIGTERM and SIGKILL of the trainer and server pods (default: "
        "120 for the trainers, time to save a checkpoint).")
    topologySpreadConstraints: Annotated[list[TopologySpreadConstraint], Field(max_length=16)] = Field(
        default_factory=list, description="Pod topology spread constraints.")
    dnsPolicy: Optional[Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"]] = Field(
        default=None, description="Pod DNS policy (with hostNetwork the default is ClusterFirstWithHostNet).")
    dnsConfig: Optional[PodDNSConfig] = Field(default=None, description="Pod DNS config.")
    hostNetwork: Optional[StrictBool] = Field(
        default=None, description="Trainer and server pods in the node's network namespace (RoCE without Multus).")
    initContainers: Annotated[list[ExtraContainer], Field(max_length=MAX_CONTAINERS)] = Field(
        default_factory=list, description="Init containers of the trainer and server pods, run before the operator's.")
    sidecars: Annotated[list[ExtraContainer], Field(max_length=MAX_CONTAINERS)] = Field(
        default_factory=list, description="Native sidecars (init containers with restartPolicy Always; Kubernetes "
        "1.29+) of the trainer and server pods.")

    @field_validator("capabilities")
    @classmethod
    def _allowed_capabilities(cls, v: list[str]) -> list[str]:
        problems = [p for p in (capability_problem(c) for c in v) if p]
        if problems:
            raise ValueError("; ".join(problems))
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _pod_rules(self) -> PodTemplate:
        if self.dnsPolicy == "None" and (self.dnsConfig is None or not self.dnsConfig.nameservers):
            raise ValueError("dnsPolicy None needs dnsConfig.nameservers (at least one): the pod would have no DNS")
        volumes = {v.get("name") for v in self.volumes} | {"tmp"}
        for c in self.initContainers + self.sidecars:
            missing = [m["name"] for m in c.volumeMounts if m["name"] not in volumes]
            if missing:
                raise ValueError(f"container {c.name} mounts {', '.join(missing)}, which is not a volume of the pod: "
                                 "add it to spec.template.volumes (or mount tmp)")
        names = [c.name for c in self.initContainers + self.sidecars]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"initContainers and sidecars share the name(s) {', '.join(dup)}: container names "
                             "must be unique in a pod")
        return self
