"""spec.template's pod-level parts a GPU cluster needs (pure): the pod securityContext, envFrom, topology spread, DNS
and the allowed capabilities — typed after Kubernetes' own core/v1 types (the fields of 1.20 on), so the CRD's schema
and the validator refuse what the API server would refuse, before any pod exists (docs/pod-template.md)."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from .base import INT32_MAX, _Model

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# an environment variable prefix (envFrom.prefix), as the API server checks it (C identifier-ish, like env names)
ENV_PREFIX = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
INT64_MAX = 2**63 - 1

# Linux capabilities a job may add to its trainer and server containers (all others stay dropped): IPC_LOCK for
# RDMA / InfiniBand memory registration (ibverbs pins memory), SYS_RESOURCE to raise the locked-memory limit,
# SYS_NICE for NUMA and CPU pinning. None of them is in PodSecurity "baseline" (docs/install.md).
ALLOWED_CAPABILITIES = {
    "IPC_LOCK": "RDMA / InfiniBand memory registration (NCCL over ibverbs)",
    "SYS_RESOURCE": "raising the locked-memory limit (ulimit -l) for RDMA",
    "SYS_NICE": "NUMA binding and CPU pinning (numactl, taskset)",
}
MAX_GRACE_SECONDS = 7 * 24 * 3600  # a week: beyond any checkpoint save
MAX_CONTAINERS = 8  # initContainers, sidecars


class SELinuxOptions(_Model):
    user: Optional[Annotated[str, Field(max_length=256)]] = Field(default=None, description="SELinux user label.")
    role: Optional[Annotated[str, Field(max_length=256)]] = Field(default=None, description="SELinux role label.")
    type: Optional[Annotated[str, Field(max_length=256)]] = Field(default=None, description="SELinux type label.")
    level: Optional[Annotated[str, Field(max_length=256)]] = Field(default=None, description="SELinux level label.")


_Id = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]


class PodSecurityContext(_Model):
    """The pod-level securityContext fields a job may set; each replaces the operator's default (uid/gid/fsGroup 1000,
    non-root, seccomp RuntimeDefault), which stays for every field left unset."""

    runAsUser: Optional[_Id] = Field(
        default=None, description="UID of the containers (not 0: the pods run as non-root).")
    runAsGroup: Optional[_Id] = Field(default=None, description="GID of the containers' processes.")
    fsGroup: Optional[_Id] = Field(
        default=None, description="GID owning the pod's volumes (NFS, Lustre, a PVC written by another group).")
    fsGroupChangePolicy: Optional[Literal["OnRootMismatch", "Always"]] = Field(
        default=None, description="OnRootMismatch skips the recursive chown of a large volume already owned.")
    supplementalGroups: Optional[Annotated[list[_Id], Field(max_length=32)]] = Field(
        default=None, description="Extra GIDs of the containers' processes.")
    seLinuxOptions: Optional[SELinuxOptions] = Field(default=None, description="SELinux labels of the containers.")

    @field_validator("runAsUser")
    @classmethod
    def _not_root(cls, v: Optional[int]) -> Optional[int]:
        if v == 0:
            raise ValueError("0 is root, and the pods run as non-root (runAsNonRoot): use your non-zero UID")
        return v


class KeyRef(_Model):
    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)] = Field(
        description="Name of the ConfigMap or Secret (same namespace).")
    optional: Optional[StrictBool] = Field(default=None, description="Start even when it does not exist.")


class EnvFromSource(_Model):
    """Every key of a ConfigMap or Secret as environment variables (e.g. the cluster's NCCL settings)."""

    prefix: Optional[Annotated[str, Field(max_length=253, pattern=ENV_PREFIX)]] = Field(
        default=None, description="Prepended to every key.")
    configMapRef: Optional[KeyRef] = Field(default=None, description="A ConfigMap.")
    secretRef: Optional[KeyRef] = Field(default=None, description="A Secret.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvFromSource:
        if (self.configMapRef is None) == (self.secretRef is None):
            raise ValueError("set exactly one of configMapRef and secretRef")
        return self


class TopologySpreadConstraint(_Model):
    maxSkew: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] = Field(description="Largest allowed imbalance.")
    topologyKey: Annotated[str, Field(min_length=1, max_length=316)] = Field(
        description="Node label of the domains (e.g. topology.kubernetes.io/zone).")
    whenUnsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(description="Hard or soft.")
    labelSelector: Optional[dict[str, object]] = Field(
        default=None, description="Pods counted (a Kubernetes LabelSelector); e.g. {matchLabels: {grpo.dev/job-name: …}}.")


class DNSConfigOption(_Model):
    name: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="resolv.conf option name.")
    value: Optional[Annotated[str, Field(max_length=253)]] = Field(default=None, description="Its value.")


class PodDNSConfig(_Model):
    # the API server's limits (core/v1 validation: MaxDNSNameservers, MaxDNSSearchPaths of 1.20)
    nameservers: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=3)] = Field(
        default_factory=list, description="Up to 3 DNS server IPs.")
    searches: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=6)] = Field(
        default_factory=list, description="Up to 6 search domains.")
    options: Annotated[list[DNSConfigOption], Field(max_length=32)] = Field(
        default_factory=list, description="resolv.conf options (e.g. ndots).")

    @field_validator("nameservers")
    @classmethod
    def _ips(cls, v: list[str]) -> list[str]:
        import ipaddress

        for ip in v:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"nameserver {ip!r} is not an IP address") from None
        return v

    @field_validator("searches")
    @classmethod
    def _domains(cls, v: list[str]) -> list[str]:
        import re

        for d in v:
            if not re.match(DNS1123_SUBDOMAIN, d.rstrip(".")):
                raise ValueError(f"search domain {d!r} is not a DNS subdomain (lowercase letters, digits, '-', '.')")
        return v


def capability_problem(cap: str) -> Optional[str]:
    """Why a capability may not be added (None: allowed)."""
    if cap in ALLOWED_CAPABILITIES:
        return None
    allowed = "; ".join(f"{k} ({v})" for k, v in ALLOWED_CAPABILITIES.items())
    if cap.upper().removeprefix("CAP_") in ALLOWED_CAPABILITIES:
        return f"{cap!r}: write it {cap.upper().removeprefix('CAP_')!r} (Kubernetes names capabilities without CAP_)"
    return (f"{cap!r} is not allowed: a training pod needs no other capability, and each one widens what a "
            f"compromised trainer could do to the node; the allowed ones are {allowed}")
