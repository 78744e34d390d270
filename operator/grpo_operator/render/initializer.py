"""spec.cache → the initializer pod (pure and deterministic): one download pod per job, role `initializer`, that runs
`python -m grpo_trainer.stage` in the trainer image and stages the model, reward models and dataset into the cache
claim (docs/cache.md). The lifecycle (lifecycle/staging.py) creates it after the job's ConfigMap, and the trainer
and vLLM pods only once it Succeeded.
"""

from __future__ import annotations

from typing import Any

from grpo_trainer import contract

from .. import api
from . import cache, manifests, pod_template

INITIALIZER_CONTAINER = "stage"
# Staging is network and disk bound: a modest request, no limit (datasets' Arrow conversion may need memory).
DEFAULT_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}}


def pod_name(job_name: str) -> str:
    """One per job (not per attempt): a gang restart finds it Succeeded and downloads nothing."""
    return f"{manifests.names(job_name).base}-stage"


def initializer_env(job: api.GRPOJob) -> list[dict[str, Any]]:
    """The trainers' environment (the user's template env: proxies, HF_ENDPOINT; the HF token by secretKeyRef),
    with HF_HOME on the claim and no offline switch: this is the one pod that reaches the Hub."""
    env = manifests._common_env(job, threads=1)
    drop = {"HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", *cache.OFFLINE_ENV}
    return [e for e in env if e["name"] not in drop] + [{"name": "HF_HOME", "value": cache.CACHE_DIR}]


def initializer_pod(job: api.GRPOJob, namespace: str, *, uid: str = "", image: str = manifests.DEFAULT_TRAINER_IMAGE,
                    metrics_port: int = manifests.DEFAULT_METRICS_PORT) -> dict[str, Any]:
    """`metrics_port`: the trainers' metrics port, where this pod answers GET /progress (the operator scrapes it into
    the Staged condition while it downloads, as it scrapes the trainers; lifecycle/staging.py); 0: off."""
    spec = job.spec
    assert spec.cache is not None, "initializer_pod needs spec.cache"
    n = manifests.names(job.metadata.name or "")
    labels = {**spec.template.metadata.labels, **manifests._labels(job, n, contract.ROLE_INITIALIZER),
              "app.kubernetes.io/name": "grpo-initializer"}
    meta = manifests._meta(pod_name(job.metadata.name or ""), namespace, labels, job.metadata.name or "", uid)
    meta["annotations"] = pod_template.pod_annotations(job, meta)  # e.g. sidecar.istio.io/inject: "false"
    container = {
        "name": INITIALIZER_CONTAINER,
        "image": spec.image or image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", contract.STAGE_MODULE],
        "args": ["--config", contract.CONFIG_FILE] + (["--progress-port", str(metrics_port)] if metrics_port else []),
        "env": initializer_env(job),
        **pod_template.env_from(job),
        "resources": DEFAULT_RESOURCES,
        "securityContext": pod_template.container_security(),
        **({"ports": [{"name": manifests.METRICS_PORT_NAME, "containerPort": metrics_port, "protocol": "TCP"}]}
           if metrics_port else {}),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": "config", "mountPath": contract.CONFIG_DIR, "readOnly": True},
                         cache.writer_mount(spec.cache)],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "restartPolicy": "Never",  # retries with backoff happen inside; a failed pod is the lifecycle's call
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "securityContext": pod_template.pod_security(job),
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}},
                        {"name": "config", "configMap": {"name": n.config_map}},
                        cache.volume(spec.cache)],
            **pod_template.pod_spec_extras(job),
        },
    }


def render_initializer(job: api.GRPOJob, namespace: str, *, uid: str = "", image: str = manifests.DEFAULT_TRAINER_IMAGE,
                       metrics_port: int = manifests.DEFAULT_METRICS_PORT) -> list[dict[str, Any]]:
    """[the initializer pod] when spec.cache is set and something comes from the Hub; [] otherwise."""
    if not cache.needs_initializer(job):
        return []
    return [initializer_pod(job, namespace, uid=uid, image=image, metrics_port=metrics_port)]
