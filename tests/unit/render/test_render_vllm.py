"""vLLM on CPU and GPU, pure: which specs the validator accepts or warns about, and what the server pod gets.

The e2e tier (tests/e2e/vllm) checks the argv against TRL's own build_command and runs it; these pin the rules."""

from __future__ import annotations

from grpo_operator.render import manifests
from grpo_operator.rules import validation


def job(mode: str, trainer_gpus: int = 0, server_limits: dict | None = None) -> dict:
    vllm: dict = {"mode": mode}
    if server_limits is not None:
        vllm["server"] = {"port": 8011, "resources": {"limits": server_limits}}
    spec = {"model": "/m", "dataset": {"name": "/d.jsonl"}, "rewards": [{"name": "length"}],
            "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2, "maxSteps": 2}, "vllm": vllm}
    if trainer_gpus:
        spec["resources"] = {"limits": {"nvidia.com/gpu": trainer_gpus}}
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "j"}, "spec": spec}


SERVER_WARNING = "spec.vllm.mode is server but the trainer pods request no GPU"


def test_colocate_on_a_cpu_job_is_valid_without_a_vllm_warning():
    res = validation.validate(job("colocate"))
    assert res.valid, res.errors
    assert not any("vllm" in w for w in res.warnings), res.warnings


def test_server_mode_with_cpu_trainers_is_valid_with_a_warning_naming_the_fix():
    res = validation.validate(job("server", server_limits={"cpu": "2", "memory": "16Gi"}))
    assert res.valid, res.errors
    [warning] = [w for w in res.warnings if SERVER_WARNING in w]
    assert "exit 10" in warning and "colocate" in warning
    assert not any(SERVER_WARNING in w for w in validation.validate(job("server", trainer_gpus=1)).warnings)


def pod_of(doc: dict, role: str) -> dict:
    res = validation.validate(doc)
    return next(o for o in manifests.core_objects(res.job, res.topology, "ns")
                if o["kind"] == "Pod" and o["metadata"]["labels"]["grpo.dev/role"] == role)


def server_container(doc: dict) -> dict:
    return pod_of(doc, "vllm-server")["spec"]["containers"][0]


def test_cpu_server_pod_runs_eager_with_kv_cache_from_its_memory_limit():
    c = server_container(job("server", server_limits={"cpu": "4", "memory": "40Gi"}))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "--enforce-eager" in c["args"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "36"  # 0.9 (the server's default utilisation, not colocate's 0.3) × 40 GiB
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CACHE_ROOT"].startswith("/tmp/")
    no_limit = server_container(job("server", server_limits={"cpu": "4"}))
    assert "VLLM_CPU_KVCACHE_SPACE" not in {e["name"] for e in no_limit["env"]}  # vLLM's own default then


def test_gpu_server_pod_keeps_cuda_graphs_and_no_cpu_settings():
    c = server_container(job("server", trainer_gpus=1, server_limits={"nvidia.com/gpu": 1}))
    names = {e["name"] for e in c["env"]}
    assert "--enforce-eager" not in c["args"] and "VLLM_CPU_KVCACHE_SPACE" not in names
    assert c["args"][c["args"].index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'


def shm_of(pod: dict) -> str | None:
    """The sizeLimit of the memory-backed volume mounted at /dev/shm, None without one."""
    [c] = pod["spec"]["containers"]
    mounted = {m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"}
    vols = [v for v in pod["spec"]["volumes"] if v["name"] in mounted]
    assert len(vols) == len(mounted) <= 1, vols
    if not vols:
        return None
    assert vols[0]["emptyDir"]["medium"] == "Memory"
    return vols[0]["emptyDir"]["sizeLimit"]


def test_every_server_pod_gets_a_shared_memory_volume_vllm_can_start_with():
    # vLLM 0.31's engine needs 160 MiB of /dev/shm; the container default (64 MiB) made the CPU server exit 1 on the
    # real node before this volume
    cpu_server = job("server", server_limits={"cpu": "2", "memory": "6Gi"})
    assert shm_of(pod_of(cpu_server, "vllm-server")) == manifests.VLLM_CPU_SHM
    assert shm_of(pod_of(job("server", trainer_gpus=1, server_limits={"nvidia.com/gpu": 1}), "vllm-server")) == "16Gi"
    # trainer pods without GPUs keep the runtime's /dev/shm (nothing in them needs more)
    assert shm_of(pod_of(cpu_server, "trainer")) is None
    cpu_server["spec"]["template"] = {"shmSize": "3Gi"}
    assert shm_of(pod_of(cpu_server, "vllm-server")) == "3Gi"  # the user's size wins
