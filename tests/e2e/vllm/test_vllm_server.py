"""vLLM server mode, as far as a CPU allows: the vLLM server pod the operator renders, run for real on CPU.

- The rendered argv is the `vllm serve` command TRL 1.16's `trl vllm-serve` would exec (its build_command).
- That argv, run here as rendered (only the bind address moved from 0.0.0.0 to loopback), serves the tiny model:
  healthy on /health (the pod's readiness probe), and TRL's own VLLMClient generates with n and logprobs.
- TRL's weight sync to the server needs CUDA (NCCL): its client refuses a CPU device, and the trainer pointed at
  the server by the rendered config stops before loading anything with the documented config error (exit 10).
What needs a GPU (the NCCL weight sync itself) is scripts/gpu-check.sh's.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.support.trainer import TINY_DATA, TINY_MODEL, free_port, run, trainer_cmd
from tests.support.vllm_runs import start_logged, stop, vllm_env

pytestmark = pytest.mark.slow

SERVER_UTILIZATION = 0.05


def job_doc(port: int) -> dict:
    return {
        "apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "srv"},
        "spec": {
            "model": str(TINY_MODEL),
            "dataset": {"name": str(TINY_DATA), "promptColumn": "question", "answerColumn": "answer"},
            "rewards": [{"name": "accuracy"}, {"name": "length", "weight": 0.5}],
            "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2, "maxSteps": 2, "maxCompletionLength": 8,
                         "reportTo": "none"},
            "vllm": {"mode": "server",
                     "server": {"port": port, "gpuMemoryUtilization": SERVER_UTILIZATION,
                                "resources": {"limits": {"cpu": "2", "memory": "16Gi"}}}},
        },
    }


def rendered(port: int) -> tuple[dict, dict, dict]:
    """(vLLM server container, its Service, the trainer config JSON) exactly as the operator renders them."""
    from grpo_operator.render import manifests
    from grpo_operator.rules import validation

    res = validation.validate(job_doc(port))
    assert res.valid, res.errors
    assert any("spec.vllm.mode is server but the trainer pods request no GPU" in w for w in res.warnings)
    objs = manifests.core_objects(res.job, res.topology, "default")
    pod = next(o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"]["grpo.dev/role"] == "vllm-server")
    service = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "srv-vllm")
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    return pod["spec"]["containers"][0], service, json.loads(cm["data"]["config.json"])


def test_rendered_server_argv_is_trl_vllm_serve_command():
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    container, service, config = rendered(8011)
    argv = container["command"] + container["args"]
    trl = build_command(ScriptArguments(model=str(TINY_MODEL), port=8011, gpu_memory_utilization=SERVER_UTILIZATION,
                                        enforce_eager=True))
    assert argv == ["vllm", *trl[trl.index("serve"):]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # what `trl vllm-serve` sets: TRL's weight-transfer endpoints
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # 0.05 × 16Gi, at least 1
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8011}
    assert service["spec"]["ports"][0]["port"] == 8011 and service["spec"]["selector"]["grpo.dev/role"] == "vllm-server"
    assert (config["vllm"]["serverHost"], config["vllm"]["serverPort"]) == ("srv-vllm.default.svc", 8011)


def test_sized_server_argv_is_trl_vllm_serve_command_with_its_extra_args():
    """spec.vllm.server's sizing fields map onto `trl vllm-serve`'s own options, extraArgs onto its extra args."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    from grpo_operator.render import manifests
    from grpo_operator.rules import validation

    doc = job_doc(8011)
    doc["spec"]["vllm"]["server"].update(maxModelLen=512, enablePrefixCaching=True, extraArgs=["--max-num-seqs", "8"])
    res = validation.validate(doc)
    assert res.valid, res.errors
    pod = next(o for o in manifests.core_objects(res.job, res.topology, "default")
               if o["kind"] == "Pod" and o["metadata"]["labels"]["grpo.dev/role"] == "vllm-server")
    c = pod["spec"]["containers"][0]
    trl = build_command(ScriptArguments(model=str(TINY_MODEL), port=8011, gpu_memory_utilization=SERVER_UTILIZATION,
                                        max_model_len=512, enable_prefix_caching=True, enforce_eager=True),
                        ["--max-num-seqs", "8"])
    assert c["command"] + c["args"] == ["vllm", *trl[trl.index("serve"):]]


def test_extra_args_flags_are_vllm_serve_flags_and_owned_flags_are_the_rendered_ones():
    """spec.vllm.server.extraArgs' table against vLLM 0.31's own `vllm serve` parser and TRL's build_command."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from grpo_operator.api import vllm_server

    parser = make_arg_parser(FlexibleArgumentParser())
    actions = {o: a for a in parser._actions for o in a.option_strings}
    for flag, takes_value in vllm_server.EXTRA_FLAGS.items():
        assert flag in actions, f"{flag} is not a vLLM 0.31 `vllm serve` flag"
        assert (actions[flag].nargs != 0) == takes_value, flag
    assert set(vllm_server.OWNED_FLAGS) <= set(actions)
    trl = build_command(ScriptArguments(model="m", max_model_len=8, enable_prefix_caching=True))
    rendered_flags = {a for a in trl if a.startswith("--")}
    trl_defaults = set(vllm_server.TRL_SERVE_FLAGS) - {"--enforce-eager", "--trust-remote-code", "--revision",
                                                      "--distributed-executor-backend", "--speculative-config"}
    assert rendered_flags - trl_defaults <= set(vllm_server.OWNED_FLAGS)


def wait_healthy(proc, url: str, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"the vLLM server exited {proc.returncode} before it was healthy: see server.log")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)  # polling the health endpoint, as the readiness probe does
    raise AssertionError(f"{url} not healthy after {timeout}s")


def test_rendered_server_generates_for_trl_client_and_the_cpu_trainer_stops_before_weight_sync(tmp_path):
    port = free_port()
    container, _service, config = rendered(port)
    argv = container["command"] + container["args"]
    argv[argv.index("--host") + 1] = "127.0.0.1"  # tests listen on loopback; nothing else differs from the pod
    pod_env = {e["name"]: e["value"] for e in container["env"]
               if e.get("value") is not None and e["name"] not in ("HOME", "HF_HOME")}
    proc = start_logged(argv, tmp_path / "server.log", **{**vllm_env(tmp_path / "tmp"), **pod_env},
                        PATH=f"{sys.prefix}/bin:{os.environ.get('PATH', '')}")
    try:
        healthy = wait_healthy(proc, f"http://127.0.0.1:{port}/health", timeout=400)
        from trl.generation.vllm_client import VLLMClient

        client = VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=10)
        out = client.generate(["What is 2 + 3 ?", "What is 7 + 1 ?"], n=3, max_tokens=6, logprobs=0)
        assert len(out["completion_ids"]) == 6 and all(1 <= len(c) <= 6 for c in out["completion_ids"])
        assert [len(lp) for lp in out["logprobs"]] == [len(c) for c in out["completion_ids"]]
        assert all(v[0] <= 0 for lp in out["logprobs"] for v in lp)
        assert client.get_world_size() == 1
        with pytest.raises(NotImplementedError, match="needs a CUDA device"):  # TRL 1.16: NCCL only
            client.init_communicator(device="cpu")
        client.session.close()

        # The trainer pointed at this server by the rendered config (the Service name resolved to loopback here).
        config["vllm"]["serverHost"] = "127.0.0.1"
        config["outputDir"] = str(tmp_path / "out")
        config["progress"] = {"enabled": True}
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps(config))
        r = run(trainer_cmd(cfg), timeout=120, **vllm_env(tmp_path / "tmp"))
        assert r.returncode == 10, r
        assert r.error_lines() == [
            "grpo_trainer: config error (exit 10): vllm.mode=server needs a CUDA GPU in the trainer pods: TRL 1.16 "
            "pushes the trained weights to the vLLM server over NCCL (VLLMClient.init_communicator) and has no CPU "
            "path; on CPU use vllm.mode: colocate (vLLM in every training process) or none, or give the trainer pods "
            "GPUs"], r
        assert "Loading weights" not in r.stderr, r  # failed before loading the model
        print(f"vLLM server on CPU healthy after {healthy:.1f}s; trainer refused in {r.wall:.1f}s")
    finally:
        stop(proc)
