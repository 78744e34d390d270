"""`grpojob check | render | crd`: the fixed contract, and bad input that must never produce a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_operator.api import crd
from grpo_operator.cli import grpojob as cli

ROOT = Path(__file__).resolve().parents[3]

GOOD = """\
apiVersion: grpo.dev/v1alpha1
kind: GRPOJob
metadata: {name: good}
spec:
  model: Qwen/Qwen2.5-0.5B-Instruct
  dataset: {name: openai/gsm8k, config: main, promptColumn: question, answerColumn: answer}
  rewards: [{name: accuracy}]
  nodes: 2
  resources: {limits: {nvidia.com/gpu: 4}}
  training: {perDeviceTrainBatchSize: 4, gradientAccumulationSteps: 2, numGenerations: 8}
  output: {volumeClaimName: ckpt}
"""
BAD_BATCH = (GOOD.replace("name: good", "name: bad")
             .replace("perDeviceTrainBatchSize: 4, gradientAccumulationSteps: 2",
                      "perDeviceTrainBatchSize: 1, gradientAccumulationSteps: 1")
             .replace("nodes: 2", "nodes: 1").replace("gpu: 4", "gpu: 3"))


def run(tmp_path, *texts, args=("-o", "json"), binary=False):
    paths = []
    for i, text in enumerate(texts):
        p = tmp_path / f"f{i}.yaml"
        if binary:
            p.write_bytes(text)
        else:
            p.write_text(text)
        paths.append(str(p))
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "check", *paths, *args],
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_valid_exit_0_and_json_contract(tmp_path):
    proc = run(tmp_path, GOOD)
    assert proc.returncode == 0, proc.stdout
    (entry,) = json.loads(proc.stdout)
    assert set(entry) == {"file", "name", "valid", "errors", "warnings", "batch"}
    assert entry["name"] == "good" and entry["valid"] is True and entry["errors"] == []
    assert entry["batch"] == {"worldSize": 8, "nprocPerNode": 4, "generationBatchSize": 64, "stepsPerGeneration": 2,
                              "promptsPerGeneration": 8, "validNumGenerations": [2, 4, 8, 16, 32, 64]}


def test_invalid_exit_1_with_field_numbers_valid_values_fix(tmp_path):
    proc = run(tmp_path, GOOD + "---\n" + BAD_BATCH)
    assert proc.returncode == 1
    good, bad = json.loads(proc.stdout)
    assert good["valid"] and not bad["valid"]
    (err,) = bad["errors"]
    assert err["field"] == "spec.training.numGenerations"
    assert "generation_batch_size (3) must be divisible by num_generations (8)." in err["message"]
    assert "this batch: 3." in err["message"] and "numGenerations 8 → 3" in err["message"]
    assert bad["batch"]["validNumGenerations"] == [3]


def test_text_output(tmp_path):
    proc = run(tmp_path, BAD_BATCH, args=())
    assert proc.returncode == 1
    assert "bad: invalid" in proc.stdout and "spec.training.numGenerations" in proc.stdout


@pytest.mark.parametrize("content,words", [
    ("a: [1, 2\n", "not valid YAML at line"),
    ("\tfoo: bar\n", "not valid YAML"),
    ("", "no YAML document"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "not a GRPOJob"),
    ("- 1\n- 2\n", "expected a GRPOJob mapping"),
    ("just a string\n", "expected a GRPOJob mapping"),
    ("!!python/object/apply:os.system ['echo pwned']\n", "not valid YAML"),
    ("a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
     "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
     "g: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n", "alias bomb"),
    ("a: &x [*x]\n", "refers to itself"),
])
def test_unreadable_exit_2(tmp_path, content, words):
    proc = run(tmp_path, content)
    assert proc.returncode == 2, proc.stdout
    (entry,) = json.loads(proc.stdout)
    assert not entry["valid"] and words in entry["errors"][0]["message"], entry


def test_missing_file_and_binary(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "check", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "cannot read file" in proc.stdout and "Traceback" not in proc.stderr
    proc = run(tmp_path, b"\xff\xfe\x00garbage", binary=True)
    assert proc.returncode == 2 and "not UTF-8" in proc.stdout


def _mutate(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize("old,new,field,words", [
    ("perDeviceTrainBatchSize: 4", "perDeviceTrainBatchSize: '4'", "spec.training.perDeviceTrainBatchSize", "valid integer"),
    ("perDeviceTrainBatchSize: 4", "perDeviceTrainBatchSize: -4", "spec.training.perDeviceTrainBatchSize", "at least 1"),
    ("perDeviceTrainBatchSize: 4", "perDeviceTrainBatchSize: 99999999999999999999999",
     "spec.training.perDeviceTrainBatchSize", "less than or equal"),
    ("perDeviceTrainBatchSize: 4", "perDeviceTrainBatchSze: 4", "spec.training", "did you mean 'perDeviceTrainBatchSize'"),
    ("numGenerations: 8", "numGenerations: 8, learningRate: .inf", "spec.training.learningRate", "finite"),
    ("numGenerations: 8", "numGenerations: 8, outputDir: /tmp", "spec.training", "spec.output.path"),
    ("numGenerations: 8", "numGenerations: 8, hubToken: hf_secret", "spec.training", "Secret"),
    ("nodes: 2", "nodes: 0", "spec.nodes", "greater than or equal to 1"),
    ("nodes: 2", "nodes: 2\n  modle: x", "spec.modle", "did you mean 'model'"),
    ("gpu: 4", "gpu: '0.5'", "spec.resources.limits[nvidia.com/gpu]", "whole number"),
    ("{name: accuracy}", "{name: acuracy}", "spec.rewards[0].name", "'accuracy'"),
    ("{name: accuracy}", "{function: 'os; rm -rf /'}", "spec.rewards[0].function", "module.path:function"),
    ("{name: accuracy}", "{name: accuracy, function: a:b}", "spec.rewards[0]", "exactly one"),
    ("model: Qwen/Qwen2.5-0.5B-Instruct", "model: '--trust-remote-code'", "spec.model", "Hub id or a path"),
    ("model: Qwen/Qwen2.5-0.5B-Instruct", "model: \"a\\nb\"", "spec.model", "Hub id or a path"),
    ("name: good", "name: Bad_Name", "metadata.name", "not a valid name"),
    ("{name: good}", "{name: good, namespace: Team A}", "metadata.namespace", "not a valid namespace"),
    ("{name: good}", "{name: good, namespace: " + "a" * 64 + "}", "metadata.namespace", "at most 63"),
    ("rewards: [{name: accuracy}]", "rewards: []", "spec.rewards", "at least 1"),
])
def test_bad_fields_are_named(tmp_path, old, new, field, words):
    proc = run(tmp_path, _mutate(GOOD, old, new))
    assert proc.returncode == 1, proc.stdout
    (entry,) = json.loads(proc.stdout)
    assert any(e["field"] == field and words in e["message"] for e in entry["errors"]), entry["errors"]


def test_unicode_everywhere(tmp_path):
    text = _mutate(GOOD, "model: Qwen/Qwen2.5-0.5B-Instruct", "model: 模型/ünïcødé-🚀")
    proc = run(tmp_path, text)
    assert proc.returncode == 0, proc.stdout  # a path may be unicode; it never reaches a shell
    proc = run(tmp_path, _mutate(GOOD, "name: good", "name: jöb"))
    assert proc.returncode == 1 and "metadata.name" in proc.stdout


def test_examples_are_valid_except_the_invalid_one():
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    code, entries, _ = cli.check_files(examples)
    for e in entries:
        assert e["valid"] == ("invalid" not in e["file"]), e


def test_render_prints_all_objects(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text(GOOD)
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "render", str(p), "--namespace", "ml"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    objs = list(yaml.safe_load_all(proc.stdout))
    # the job's NetworkPolicy first (networkPolicy.perJob is on in the chart), admitting the chart's operator
    assert [o["kind"] for o in objs] == ["NetworkPolicy", "ConfigMap", "Service", "Pod", "Pod"]
    assert all(o["metadata"]["namespace"] == "ml" for o in objs)
    operator = objs[0]["spec"]["ingress"][1]["from"][0]
    assert operator["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "grpo-system"}
    assert operator["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "grpo-operator",
                                                      "app.kubernetes.io/instance": "grpo-operator"}
    p.write_text(BAD_BATCH)
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "render", str(p)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "numGenerations" in proc.stderr and proc.stdout == ""


def test_render_prints_the_download_pod_of_spec_cache(tmp_path):
    doc = yaml.safe_load(GOOD)
    doc["spec"]["cache"] = {"volumeClaimName": "hf-cache"}
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "render", str(p)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    objs = list(yaml.safe_load_all(proc.stdout))
    assert [o["kind"] for o in objs] == ["NetworkPolicy", "ConfigMap", "Service", "Pod", "Pod", "Pod"]
    assert objs[3]["metadata"]["labels"]["grpo.dev/role"] == "initializer"


def test_render_network_policy_flags(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text(GOOD)
    grpojob = [sys.executable, "-m", "grpo_operator.cli.grpojob", "render", str(p)]
    proc = subprocess.run(grpojob + ["--no-network-policy"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [o["kind"] for o in yaml.safe_load_all(proc.stdout)] == ["ConfigMap", "Service", "Pod", "Pod"]
    proc = subprocess.run(grpojob + ["--operator-namespace", "ops", "--operator-labels", "app=op,tier=ctl"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    operator = next(yaml.safe_load_all(proc.stdout))["spec"]["ingress"][1]["from"][0]
    assert operator == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
                        "podSelector": {"matchLabels": {"app": "op", "tier": "ctl"}}}
    proc = subprocess.run(grpojob + ["--operator-labels", "app"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "--operator-labels='app'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("namespace", ["bad ns", "Team", "a" * 64, "-x", "x;id"])
def test_render_refuses_an_invalid_namespace_flag(tmp_path, namespace):
    p = tmp_path / "job.yaml"
    p.write_text(GOOD)
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "render", str(p), f"--namespace={namespace}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert "--namespace" in proc.stderr and "not a valid namespace" in proc.stderr


def test_crd_command_matches_checked_in_file():
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "crd"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout == (ROOT / "crds" / "grpo.dev_grpojobs.yaml").read_text(), "run: grpojob crd > crds/grpo.dev_grpojobs.yaml"


def test_crd_command_for_a_kubernetes_version():
    """Issue 27, finding 4: the CRD the chart installs on each server (api/crd.py): before 1.21 no int-or-string,
    before 1.25 an atomic spec; a version that is not one is a usage error, not a traceback."""
    for version, kube in (("1.20", (1, 20)), ("v1.20.2", (1, 20)), ("1.21", (1, 21)), ("1.24.17", (1, 24)),
                          ("1.28+", (1, 28)), ("1.36.0", (1, 36))):
        proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "crd", "--kube-version", version],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout == crd.crd_yaml(kube), version
        assert ("x-kubernetes-map-type: atomic" in proc.stdout) is (kube < (1, 25)), version
        assert ("x-kubernetes-int-or-string" in proc.stdout) is (kube >= (1, 21)), version
    proc = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "crd", "--kube-version", "latest"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and not proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    assert 'grpojob crd: --kube-version "latest" is not a Kubernetes version: write MAJOR.MINOR' in proc.stderr


def test_server_mode_example_is_complete_and_check_explains_the_servers_gpus():
    """examples/vllm-server.yaml uses every spec.vllm.server field but dataParallelSize (derived); `check` prints
    the server's GPUs next to the trainers' (the JSON entry keeps the fixed contract: no extra keys)."""
    path = str(ROOT / "examples" / "vllm-server.yaml")
    server = yaml.safe_load(open(path))["spec"]["vllm"]["server"]
    from grpo_operator import api
    assert set(api.VllmServerSpec.model_fields) - set(server) == {"dataParallelSize", "port", "image"}
    notes: list = []
    code, entries, _ = cli.check_files([path], notes)
    assert code == 0 and set(entries[0]) == {"file", "name", "valid", "errors", "warnings", "batch"}
    [lines] = notes
    assert lines[0].startswith("memory per GPU (3B parameters")  # rules/memory.py, then the server's GPUs
    line = lines[-1]
    assert "trainers: 1 pod(s) × 4 nvidia.com/gpu" in line
    assert "vLLM server: 1 pod × 2 nvidia.com/gpu (not in the world size) = tensor parallel 2 × data parallel 1" in line


def test_check_explains_memory_for_lora_and_full_fine_tuning(capsys):
    """`grpojob check` explains each GPU's memory (rules/memory.py), for LoRA with the full fine-tuning figure."""
    assert cli.main(["check", str(ROOT / "examples" / "lora-7b.yaml"), str(ROOT / "examples" / "multi-node.yaml")]) == 0
    out = capsys.readouterr().out
    assert "memory per GPU (7B parameters from the model id; weights in float32" in out
    assert "LoRA: gradients and AdamW states for the adapter only, no reference copy" in out
    assert "full fine-tuning would need ≈ 104.3 GiB" in out and "with LoRA (spec.peft) ≈ 26.1 GiB" in out
