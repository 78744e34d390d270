"""`grpojob check|render --defaults FILE` (the platform's jobDefaults, merged as the operator merges them),
`render --cpu-image` (the image follows the pods' hardware), and `check` printing GPU memory figures only for jobs
with GPUs (before, a CPU job was told "memory per GPU … vLLM colocate reserves 30% of each GPU")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
VALUES = REPO / "examples" / "platform" / "job-defaults-values.yaml"


def grpojob(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def cpu_job(tmp_path: Path, template: dict | None = None) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
    doc["spec"].pop("resources", None)
    doc["spec"]["vllm"] = {"mode": "none"}
    doc["spec"]["training"] = {"perDeviceTrainBatchSize": 2, "numGenerations": 2}
    if template is not None:
        doc["spec"]["template"] = template
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_check_prints_gpu_memory_only_for_gpu_jobs(tmp_path: Path) -> None:
    gpu = grpojob("check", "examples/minimal.yaml")
    assert gpu.returncode == 0 and "memory per GPU" in gpu.stdout
    cpu = grpojob("check", str(cpu_job(tmp_path)))
    assert cpu.returncode == 0, cpu.stdout + cpu.stderr
    assert "GPU" not in cpu.stdout, cpu.stdout


def test_check_with_defaults_validates_the_merged_template(tmp_path: Path) -> None:
    job = cpu_job(tmp_path, {"dnsPolicy": "None"})
    assert grpojob("check", str(job)).returncode == 1  # alone: dnsPolicy None without a nameserver
    defaults = tmp_path / "d.yaml"
    defaults.write_text("dnsConfig: {nameservers: [10.0.0.10]}\n")
    out = grpojob("check", "--defaults", str(defaults), str(job))
    assert out.returncode == 0, out.stdout + out.stderr


def test_render_with_defaults_and_two_images(tmp_path: Path) -> None:
    out = grpojob("render", "--defaults", str(VALUES), "--image", "cuda:1", "--cpu-image", "cpu:1",
                  "--no-network-policy", str(cpu_job(tmp_path)))
    assert out.returncode == 0, out.stderr
    pod = next(o for o in yaml.safe_load_all(out.stdout) if o["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["image"] == "cpu:1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 1800 and pod["spec"]["securityContext"]["fsGroup"] == 4000
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    gpu = grpojob("render", "--image", "cuda:1", "--cpu-image", "cpu:1", "--no-network-policy", "examples/minimal.yaml")
    assert {o["spec"]["containers"][0]["image"] for o in yaml.safe_load_all(gpu.stdout) if o["kind"] == "Pod"} == \
        {"cuda:1"}


def test_bad_defaults_file_is_exit_2_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("capabilities: [SYS_ADMIN]\n")
    for command in ("check", "render"):
        out = grpojob(command, "--defaults", str(bad), "examples/minimal.yaml")
        assert out.returncode == 2 and "bad.yaml" in out.stderr and "SYS_ADMIN" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    missing = grpojob("check", "--defaults", str(tmp_path / "none.yaml"), "examples/minimal.yaml")
    assert missing.returncode == 2 and "No such file" in missing.stderr, missing.stderr
