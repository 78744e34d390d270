"""spec.vllm.server sized as a server: the fields reach the server pod's argv, probes and placement; extraArgs and
dataParallelSize are checked with the reason (tests/e2e/vllm checks the flag table against vLLM 0.31's parser)."""

from __future__ import annotations

import pytest

from grpo_operator import api
from grpo_operator.render import vllm_server
from grpo_operator.rules import validation


def doc(server: dict, *, tp: int = 1, vllm_extra: dict | None = None, template: dict | None = None) -> dict:
    spec = {"model": "/m", "dataset": {"name": "/d.jsonl"}, "rewards": [{"name": "length"}],
            "resources": {"limits": {"nvidia.com/gpu": 4}},
            "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2, "maxSteps": 2},
            "vllm": {"mode": "server", "tensorParallelSize": tp, "server": server, **(vllm_extra or {})}}
    if template:
        spec["template"] = template
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "j"}, "spec": spec}


def server_pod(d: dict) -> dict:
    from grpo_operator.render import manifests

    res = validation.validate(d)
    assert res.valid, res.errors
    objs = manifests.core_objects(res.job, res.topology, "ns")
    return next(o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"]["grpo.dev/role"] == "vllm-server")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_defaults_are_a_servers_not_colocates():
    c = server_pod(doc({"resources": {"limits": {"nvidia.com/gpu": 2}}}))["spec"]["containers"][0]
    assert flag(c["args"], "--gpu-memory-utilization") == "0.9"  # not colocate's 0.3
    assert flag(c["args"], "--data-parallel-size") == "2"  # 2 GPUs ÷ tensor parallel 1
    assert "--max-model-len" not in c["args"] and not any("prefix-caching" in a for a in c["args"])
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800


def test_every_field_reaches_the_pod():
    pod = server_pod(doc({"resources": {"limits": {"nvidia.com/gpu": 4}}, "gpuMemoryUtilization": 0.85,
                          "maxModelLen": 4096, "enablePrefixCaching": False, "dataParallelSize": 2,
                          "extraArgs": ["--max-num-seqs", "64", "--enforce-eager", "--dtype=bfloat16"],
                          "nodeSelector": {"pool": "infer"}, "tolerations": [{"key": "infer", "operator": "Exists"}],
                          "startupTimeoutSeconds": 3600}, tp=2, template={"nodeSelector": {"pool": "train"}}))
    c = pod["spec"]["containers"][0]
    a = c["args"]
    assert (flag(a, "--gpu-memory-utilization"), flag(a, "--max-model-len"), flag(a, "--data-parallel-size"),
            flag(a, "--tensor-parallel-size")) == ("0.85", "4096", "2", "2")
    assert "--no-enable-prefix-caching" in a
    assert a[-4:] == ["--max-num-seqs", "64", "--enforce-eager", "--dtype=bfloat16"]  # last: the user's wins
    assert pod["spec"]["nodeSelector"] == {"pool": "infer"}
    assert pod["spec"]["tolerations"] == [{"key": "infer", "operator": "Exists"}]
    assert c["startupProbe"]["failureThreshold"] == 360 and c["startupProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert c["livenessProbe"]["failureThreshold"] == vllm_server.LIVENESS_FAILURES


def test_server_placement_defaults_to_the_template():
    pod = server_pod(doc({"resources": {"limits": {"nvidia.com/gpu": 1}}}, template={"nodeSelector": {"p": "t"}}))
    assert pod["spec"]["nodeSelector"] == {"p": "t"}
    cleared = server_pod(doc({"resources": {"limits": {"nvidia.com/gpu": 1}}, "nodeSelector": {}},
                             template={"nodeSelector": {"p": "t"}}))
    assert "nodeSelector" not in cleared["spec"]


@pytest.mark.parametrize("args,why", [
    (["--port", "9000"], "--port is set by the operator: set spec.vllm.server.port"),
    (["--gpu_memory_utilization=0.5"], "--gpu-memory-utilization is set by the operator"),
    (["-tp", "2"], "set spec.vllm.tensorParallelSize"),
    (["--weight-transfer-config", "{}"], "NCCL weight-transfer engine"),
    (["--api-key", "x"], "--api-key is not a `vllm serve` flag the operator passes on"),
    (["--max-num-seqs"], "--max-num-seqs needs a value"),
    (["--enforce-eager=1"], "--enforce-eager takes no value"),
    (["serve"], "'serve' is not a flag"),
    (["--seed", "1; rm -rf /"], None),  # a value is a value: an argv item, never a shell word
    (["--seed", "-1"], None),
])
def test_extra_args_refused_with_the_reason(args, why):
    res = validation.validate(doc({"resources": {"limits": {"nvidia.com/gpu": 1}}, "extraArgs": args}))
    if why is None:
        assert res.valid, res.errors
        return
    assert not res.valid
    [err] = [e for e in res.errors if e.field == "spec.vllm.server.extraArgs"]
    assert why in err.message, err.message


@pytest.mark.parametrize("gpus,tp,dp,field", [
    (4, 2, 2, None), (4, 2, None, None), (4, 1, 2, "spec.vllm.server.dataParallelSize"),
    (3, 2, None, "spec.vllm.tensorParallelSize"), (0, 1, 1, None), (0, 1, 2, "spec.vllm.server.dataParallelSize"),
])
def test_data_parallel_times_tensor_parallel_is_the_servers_gpus(gpus, tp, dp, field):
    limits = {"nvidia.com/gpu": gpus} if gpus else {"cpu": "4", "memory": "16Gi"}
    server = {"resources": {"limits": limits}, **({"dataParallelSize": dp} if dp else {})}
    res = validation.validate(doc(server, tp=tp))
    fields = {e.field for e in res.errors}
    assert (field in fields) if field else res.valid, res.errors


def test_colocate_utilisation_in_server_mode_is_a_warning_naming_the_server_field():
    res = validation.validate(doc({"resources": {"limits": {"nvidia.com/gpu": 1}}},
                                  vllm_extra={"gpuMemoryUtilization": 0.5}))
    assert res.valid and any("spec.vllm.server.gpuMemoryUtilization" in w for w in res.warnings)


def test_every_server_field_has_a_description():
    for name, f in api.VllmServerSpec.model_fields.items():
        assert f.description, name
