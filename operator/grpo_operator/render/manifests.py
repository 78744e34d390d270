"""A validated GRPOJob → the Kubernetes objects that run it (pure and deterministic).

The operator, `grpojob render` and `grpojob run --local` all call these functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Optional

from grpo_trainer import contract

from .. import api
from ..rules import restarts, topology
from . import cache, gangs, parallelism, pod_template, vllm_server
from .names import MAX_BASE as MAX_BASE
from .names import Names as Names
from .names import names as names
from .names import pod_name as pod_name
from .names import pod_names as pod_names
from .quantities import parse_quantity

DEFAULT_TRAINER_IMAGE = "ghcr.io/grpo-operator/grpo-trainer:0.1.0"  # the CUDA image
DEFAULT_CPU_TRAINER_IMAGE = DEFAULT_TRAINER_IMAGE + "-cpu"
TRAINER_GRACE_SECONDS = 120  # time for the trainer to save a checkpoint on SIGTERM (spec.template overrides it)
TRAINER_MODULE = "grpo_trainer"
# Names, ports and files the trainer relies on: the operator↔trainer contract (grpo_trainer/contract.py)
C10D_PORT = contract.C10D_PORT
DEFAULT_METRICS_PORT = contract.METRICS_PORT  # the trainer's Prometheus endpoint (docs/observability.md); 0 = off
METRICS_PORT_NAME = contract.METRICS_PORT_NAME
CONFIG_DIR, CONFIG_FILE = contract.CONFIG_DIR, contract.CONFIG_FILE
LABEL_JOB, LABEL_ROLE, LABEL_RANK = contract.LABEL_JOB, contract.LABEL_ROLE, contract.LABEL_RANK
LABEL_ATTEMPT = contract.LABEL_ATTEMPT  # so that clients can select one attempt's pods
ANNOTATION_ATTEMPT, ANNOTATION_JOB = contract.ANNOTATION_ATTEMPT, contract.ANNOTATION_JOB
ROLE_TRAINER, ROLE_VLLM = contract.ROLE_TRAINER, contract.ROLE_VLLM
TRAINER_CONTAINER, VLLM_CONTAINER = "trainer", "vllm"  # container names (logs, resourceFieldRef)
PASS_THROUGH_LABELS = gangs.PASS_THROUGH_LABELS  # the job's labels its pods carry too (a gang scheduler's)

# torchrun itself exits 1 whenever a worker fails, which reads as "permanent"; grpo_trainer.launch is torchrun's own
# launcher run in-process that exits with the workers' contract code instead (docs/trainer.md).
LAUNCHER = ["python", "-m", "grpo_trainer.launch"]


def torchrun_argv(nnodes: int, nproc_per_node: int, rdzv_endpoint: str, rdzv_id: str,
                  config_path: str = CONFIG_FILE, max_restarts: int = 0) -> list[str]:
    """The trainer container's argv (never a shell string): torchrun's arguments, then the trainer module.

    `max_restarts`: in-place restarts of the workers (runPolicy.restartPolicy InPlace, rules/restarts.py): after a
    worker failure every node's agent restarts its workers in the same pods, in a new rendezvous round, and they
    resume from the latest checkpoint; 0: a worker failure ends the pod and the operator recreates the gang.

    No --node-rank: c10d ignores it (and warns on every agent but one); it orders ranks by the agents' host names, so
    pod node-N is not global rank N (from 11 nodes: node-10 sorts before node-2). Nothing may assume it is."""
    return [
        *LAUNCHER,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--max-restarts={max_restarts}",
        "-m",
        TRAINER_MODULE,
        "--config",
        config_path,
    ]


def trainer_config(job: api.GRPOJob, namespace: str, uid: str = "", output_dir: Optional[str] = None,
                   metrics_port: int = DEFAULT_METRICS_PORT) -> dict[str, Any]:
    """The JSON the trainer reads (docs/trainer-config.md)."""
    spec = job.spec
    n = names(job.metadata.name or "")
    server_host = None
    if spec.vllm.mode == "server":
        server_host = f"{n.vllm}.{namespace}.svc"
    return {
        "schemaVersion": contract.SCHEMA_VERSION,
        "job": {"name": job.metadata.name, "namespace": namespace, "uid": uid},
        "model": spec.model,
        "dataset": spec.dataset.model_dump(),
        "rewards": [{k: v for k, v in r.model_dump().items() if k != "model" or v is not None} for r in spec.rewards],
        # the preset adds deepspeed or fsdp/fsdp_config; the validator refuses it next to the raw fields
        "training": {**api.training_kwargs(spec.training), **parallelism.training_arguments(spec.parallelism)},
        "vllm": {
            "mode": spec.vllm.mode,
            "tensorParallelSize": spec.vllm.tensorParallelSize,
            "gpuMemoryUtilization": spec.vllm.gpuMemoryUtilization,
            "serverHost": server_host,
            "serverPort": (spec.vllm.server or api.VllmServerSpec()).port,
        },
        "outputDir": output_dir or f"{spec.output.path.rstrip('/')}/{n.base}",
        # GRPO_PROGRESS lines in the pod log, and /metrics on metricsPort: the operator's status.progress source
        "progress": {"enabled": True, "metricsPort": metrics_port},
        **({"peft": spec.peft.model_dump(exclude_none=True)} if spec.peft is not None else {}),
    }


def _labels(job: api.GRPOJob, n: Names, role: str) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "grpo-trainer" if role == ROLE_TRAINER else ROLE_VLLM,
        "app.kubernetes.io/instance": n.base,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/part-of": "grpo-operator",
        "app.kubernetes.io/managed-by": "grpo-operator",
        LABEL_JOB: n.base,
        LABEL_ROLE: role,
    }
    job_labels = job.metadata.model_extra.get("labels") if job.metadata.model_extra else None
    if isinstance(job_labels, dict):
        for key in PASS_THROUGH_LABELS:
            if isinstance(job_labels.get(key), str):
                labels[key] = job_labels[key]
    return labels


def selector(job_name: str, role: str = ROLE_TRAINER) -> dict[str, str]:
    return {LABEL_JOB: names(job_name).base, LABEL_ROLE: role}


def _meta(name: str, namespace: str, labels: dict[str, str], job_name: str, uid: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels,
                            "annotations": {ANNOTATION_JOB: job_name}}
    if uid:
        meta["ownerReferences"] = [{
            "apiVersion": api.API_VERSION, "kind": api.KIND, "name": job_name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True,
        }]
    return meta


def trainer_threads(res: api.ResourceRequirements, topo: topology.Topology) -> int | dict[str, Any]:
    """OMP_NUM_THREADS of a trainer process: the pod's CPUs shared by its local processes.

    GPU pods: 1 (the GPU does the work). CPU pods: the CPU limit (else the request) ÷ nproc, at least 1 - a fixed 4
    made 2-core pods 4-5× slower. No CPU in the spec and one process: the downward API's limits.cpu, which is the
    node's allocatable CPUs when the pod has no limit (whole cores). Several processes: 1, as torchrun would set."""
    if topo.gpu_resource:
        return 1
    for side in (res.limits, res.requests):
        if side and "cpu" in side:
            try:
                cores, _ = parse_quantity(side["cpu"])
            except ValueError:
                break
            return max(1, int(cores) // max(1, topo.nproc_per_node))
    if topo.nproc_per_node == 1:
        return {"resourceFieldRef": {"containerName": TRAINER_CONTAINER, "resource": "limits.cpu", "divisor": "1"}}
    return 1


def _common_env(job: api.GRPOJob, threads: int | dict[str, Any]) -> list[dict[str, Any]]:
    omp = {"name": "OMP_NUM_THREADS", "valueFrom": threads} if isinstance(threads, dict) else \
        {"name": "OMP_NUM_THREADS", "value": str(threads)}
    env: list[dict[str, Any]] = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        omp,
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        # datasets ignores the one above: without this, every load_dataset of a packaged builder (json, csv,
        # parquet) sends a HEAD to s3.amazonaws.com (its download count; timeout 3 s) - a network call at every
        # pod's start that `grpojob run --local` (offline) does not make (docs/performance.md, "The journey").
        {"name": "HF_UPDATE_DOWNLOAD_COUNTS", "value": "0"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": "/tmp/hf-home"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    ref = job.spec.hfTokenSecretRef
    if ref is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    ours = {e["name"] for e in env}
    for e in job.spec.template.env:
        if e.name in ours:
            env = [x for x in env if x["name"] != e.name]  # the user's value wins (e.g. OMP_NUM_THREADS)
        env.append(e.model_dump(exclude_none=True))
    return env


# vLLM's multiprocess engine puts its 160 MiB message queue in /dev/shm; a container's default is 64 MiB, so a server
# pod without GPUs (whose default would be none) still gets a memory-backed one (measured: vLLM 0.31 CPU refuses to
# start with "Insufficient space in /dev/shm").
VLLM_CPU_SHM = "1Gi"


def _volumes(job: api.GRPOJob, n: Names, topo: topology.Topology, with_config: bool,
             shm_default: Optional[str] = None) -> tuple[list[Any], list[Any]]:
    spec = job.spec
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    if with_config:
        volumes.append({"name": "config", "configMap": {"name": n.config_map}})
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    if spec.output.volumeClaimName:
        volumes.append({"name": "output", "persistentVolumeClaim": {"claimName": spec.output.volumeClaimName}})
    else:
        volumes.append({"name": "output", "emptyDir": {}})
    mounts.append({"name": "output", "mountPath": spec.output.path})
    shm = spec.template.shmSize if spec.template.shmSize is not None else ("16Gi" if topo.gpu_resource else shm_default)
    if shm is not None:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(shm)}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    volumes += [dict(v) for v in spec.template.volumes]
    mounts += [dict(m) for m in spec.template.volumeMounts]
    return volumes, mounts


def _scrape_annotations(metrics_port: int) -> dict[str, str]:
    """The classic prometheus.io annotations (annotation-based scrape configs); PodMonitors use the port name."""
    if not metrics_port:
        return {}
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port), "prometheus.io/path": "/metrics"}


def trainer_pod(job: api.GRPOJob, topo: topology.Topology, namespace: str, rank: int, *, uid: str = "",
                image: str = DEFAULT_TRAINER_IMAGE, attempt: int = 0,
                metrics_port: int = DEFAULT_METRICS_PORT, cpu_image: Optional[str] = None,
                max_restarts: Optional[int] = None) -> dict[str, Any]:
    n = names(job.metadata.name or "")
    labels = {**job.spec.template.metadata.labels, **_labels(job, n, ROLE_TRAINER), LABEL_RANK: str(rank),
              LABEL_ATTEMPT: str(attempt)}
    meta = _meta(pod_name(job, n.pod(rank), attempt), namespace, labels, job.metadata.name or "", uid)
    meta["annotations"] = {**_scrape_annotations(metrics_port), **job.spec.template.metadata.annotations,
                           **meta["annotations"], ANNOTATION_ATTEMPT: str(attempt)}
    volumes, mounts = _volumes(job, n, topo, with_config=True)
    env = _common_env(job, threads=trainer_threads(job.spec.resources, topo)) \
        + [{"name": "GRPO_NODE_RANK", "value": str(rank)}, {"name": "GRPO_ATTEMPT", "value": str(attempt)}]
    cache.apply_reader(job, volumes, mounts, env)  # spec.cache: the staged cache, read offline
    rdzv_id = f"{uid or n.base}-{attempt}"
    if max_restarts is None:  # a new job's budget (the lifecycle passes what the restarts so far left)
        max_restarts = restarts.in_place_budget(job.spec.runPolicy.restartPolicy, job.spec.runPolicy.backoffLimit, 0)
    argv = torchrun_argv(topo.nodes, topo.nproc_per_node, f"{n.pod(0)}.{n.service}:{C10D_PORT}", rdzv_id,
                         max_restarts=max_restarts)
    container = {
        "name": TRAINER_CONTAINER,
        "image": pod_template.pick_image(job, bool(topo.gpu_resource), image, cpu_image),
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:len(LAUNCHER)],
        "args": argv[len(LAUNCHER):],
        "env": env,
        **pod_template.env_from(job),
        "ports": [{"name": "c10d", "containerPort": C10D_PORT, "protocol": "TCP"}]
        + ([{"name": METRICS_PORT_NAME, "containerPort": metrics_port, "protocol": "TCP"}] if metrics_port else []),
        "resources": pod_template.container_resources(job.spec.resources),
        "securityContext": pod_template.container_security(job.spec.template.capabilities),
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "hostname": n.pod(rank),
            "subdomain": n.service,
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": TRAINER_GRACE_SECONDS,
            "securityContext": pod_template.pod_security(job),
            "containers": [container],
            "volumes": volumes,
            **pod_template.pod_spec_extras(job),
            **pod_template.runtime_extras(job),
        },
    }


def headless_service(job: api.GRPOJob, namespace: str, *, uid: str = "") -> dict[str, Any]:
    n = names(job.metadata.name or "")
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(n.service, namespace, _labels(job, n, ROLE_TRAINER), job.metadata.name or "", uid),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # rendezvous happens before any pod is Ready
            "selector": selector(job.metadata.name or ""),
            "ports": [{"name": "c10d", "port": C10D_PORT, "targetPort": C10D_PORT, "protocol": "TCP"}],
        },
    }


def config_map(job: api.GRPOJob, namespace: str, *, uid: str = "", metrics_port: int = DEFAULT_METRICS_PORT) -> dict[str, Any]:
    n = names(job.metadata.name or "")
    data = json.dumps(trainer_config(job, namespace, uid, metrics_port=metrics_port), indent=2, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(n.config_map, namespace, _labels(job, n, ROLE_TRAINER), job.metadata.name or "", uid),
        "data": {"config.json": data + "\n"},
    }


def vllm_server_argv(job: api.GRPOJob, gpus: int, *, cpu: bool = False) -> list[str]:
    """The vLLM server's argv (render/vllm_server.py server_argv)."""
    return vllm_server.server_argv(job, gpus, cpu=cpu)


def _vllm_cpu_env(utilization: float, res: api.ResourceRequirements) -> list[dict[str, Any]]:
    """vLLM's CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB): gpuMemoryUtilization × the server's
    memory limit, as the trainer does for colocate (docs/trainer.md); without a limit vLLM takes that fraction of
    the node's RAM itself. Its caches go to /tmp (HOME is /tmp; the root filesystem is read-only)."""
    env = [{"name": "VLLM_CACHE_ROOT", "value": "/tmp/vllm-cache"}]
    memory = res.limits.get("memory")
    try:
        limit, _ = parse_quantity(memory) if memory is not None else (None, "")
    except ValueError:
        limit = None
    if limit is not None:
        env.append({"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(max(1, int(limit * Decimal(str(utilization)) / 2**30)))})
    return env


def vllm_objects(job: api.GRPOJob, topo: topology.Topology, namespace: str, *, uid: str = "",
                 image: str = DEFAULT_TRAINER_IMAGE, attempt: int = 0,
                 cpu_image: Optional[str] = None) -> list[dict[str, Any]]:
    spec = job.spec
    n = names(job.metadata.name or "")
    server = spec.vllm.server or api.VllmServerSpec()
    res, gpus, _ = vllm_server.resources(job, topo.gpu_resource)
    stopo, _ = topology.resolve(1, res.limits, res.requests, None)
    labels = {**spec.template.metadata.labels, **_labels(job, n, ROLE_VLLM)}
    cpu = not (stopo and stopo.gpu_resource)
    volumes, mounts = _volumes(job, n, topo if topo.gpu_resource else stopo or topo, with_config=False,
                               shm_default=VLLM_CPU_SHM if cpu else None)
    argv = vllm_server_argv(job, gpus, cpu=cpu)
    # dev mode: TRL's weight-transfer and cache endpoints (what `trl vllm-serve` sets)
    env = _common_env(job, threads=1) + [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}] \
        + (_vllm_cpu_env(server.gpuMemoryUtilization, res) if cpu else [])
    cache.apply_reader(job, volumes, mounts, env)
    meta = _meta(pod_name(job, n.vllm_pod(0), attempt), namespace, labels, job.metadata.name or "", uid)
    meta["annotations"][ANNOTATION_ATTEMPT] = str(attempt)  # the server belongs to the attempt like a trainer
    meta["annotations"] = pod_template.pod_annotations(job, meta)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "securityContext": pod_template.pod_security(job),
            "containers": [{
                "name": VLLM_CONTAINER,
                "image": server.image or pod_template.pick_image(job, not cpu, image, cpu_image),
                "imagePullPolicy": "IfNotPresent",
                "command": argv[:1],
                "args": argv[1:],
                "env": env,
                **pod_template.env_from(job),
                "ports": [{"name": "http", "containerPort": server.port, "protocol": "TCP"}],
                **vllm_server.probes(job),
                "resources": pod_template.container_resources(res),
                "securityContext": pod_template.container_security(spec.template.capabilities),
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
            **vllm_server.scheduling(job, pod_template.pod_spec_extras(job)),
            **pod_template.runtime_extras(job),
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(n.vllm, namespace, _labels(job, n, ROLE_VLLM), job.metadata.name or "", uid),
        "spec": {
            "selector": selector(job.metadata.name or "", ROLE_VLLM),
            "ports": [{"name": "http", "port": server.port, "targetPort": server.port, "protocol": "TCP"}],
        },
    }
    return [service, pod]


def core_objects(job: api.GRPOJob, topo: topology.Topology, namespace: str, *, uid: str = "",
           image: str = DEFAULT_TRAINER_IMAGE, attempt: int = 0,
           metrics_port: int = DEFAULT_METRICS_PORT, groups: Optional[Mapping[str, str]] = None,
           cpu_image: Optional[str] = None, max_restarts: Optional[int] = None) -> list[dict[str, Any]]:
    """The job's own objects, in creation order: ConfigMap, Services, the gang scheduler's objects, pods.
    Not everything the operator creates: render/job.py's render() adds spec.cache's download pod and the job's
    NetworkPolicy, and that one is what the operator, `grpojob render` and the operator bench call.

    `metrics_port`: the trainer's Prometheus port (config JSON progress.metricsPort and the pods' `metrics`
    containerPort); 0 turns the trainer's metrics, and with them status.progress, off. `groups`: the gang
    scheduler's group each role's pods join, by role (the lifecycle's choice, Decision.groups; a role missing: a new
    group named after this attempt).
    `image`, `cpu_image`: the operator's CUDA and CPU trainer images (pick_image; spec.image wins). `max_restarts`:
    the attempt's in-place restarts (torchrun_argv; None: a new job's, rules/restarts.py)."""
    objs: list[dict[str, Any]] = [config_map(job, namespace, uid=uid, metrics_port=metrics_port),
                                  headless_service(job, namespace, uid=uid)]
    if job.spec.vllm.mode == "server":
        objs += vllm_objects(job, topo, namespace, uid=uid, image=image, attempt=attempt, cpu_image=cpu_image)
    objs += [trainer_pod(job, topo, namespace, r, uid=uid, image=image, attempt=attempt, metrics_port=metrics_port,
                         cpu_image=cpu_image, max_restarts=max_restarts) for r in range(topo.nodes)]
    return _gang(job, namespace, objs, uid=uid, attempt=attempt, groups=groups or {})


def _gang(job: api.GRPOJob, namespace: str, objs: list[dict[str, Any]], *, uid: str, attempt: int,
          groups: Mapping[str, str]) -> list[dict[str, Any]]:
    """Gang admission/scheduling: each scheduler that takes the job (render/gangs) marks the pods and adds its
    objects, placed before the pods. (Per-attempt pod names: pod_name.)"""
    n = names(job.metadata.name or "")
    # server mode creates the server before the trainers (lifecycle/server/first.py): a gang that counted it would
    # hold it (at the scheduler's gate or Permit) until the trainers exist, so the gang is the trainers; a scheduler
    # that admits the server gives it a group of its own
    pods = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"].get(LABEL_ROLE) != ROLE_VLLM]
    servers = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"].get(LABEL_ROLE) == ROLE_VLLM]
    labels = {k: v for k, v in _labels(job, n, ROLE_TRAINER).items()
              if k not in (LABEL_ROLE, "app.kubernetes.io/component", "app.kubernetes.io/name")}
    added: list[dict[str, Any]] = []
    for unit in gangs.selected(job):
        unit.decorate(job, pods, servers, base=n.base, uid=uid, attempt=attempt, groups=groups)
        added += unit.objects(job, pods, name=n.base, namespace=namespace, labels=labels,
                              annotations={ANNOTATION_JOB: job.metadata.name or ""}, uid=uid)
    if added:
        at = next(i for i, o in enumerate(objs) if o["kind"] == "Pod")
        objs[at:at] = added
    return objs
