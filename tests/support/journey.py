"""The user's journey on a cluster, shared by tests/e2e/node/test_journey.py and bench/journey_bench.py: the chart
installed with the real helm, the images (scripts/build-images.sh, cached by input hash), the tiny job as a user
writes it (model and data shipped as ConfigMaps, so it runs on any cluster), and readers of what kubectl shows.

Every command and its output goes to a transcript (the issue's note quotes it).
Nothing here imports grpo_operator.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .node import REPO, TOOLS, NodeCluster, wait_for

CHART = REPO / "charts" / "grpo-operator"
RELEASE, OP_NAMESPACE = "grpo", "grpo-system"
PROGRESS = "GRPO_PROGRESS "


def chart_images() -> tuple[str, str]:
    """(operator image, default trainer image) as the chart names them (what build-images.sh names the archives)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}", values["trainerImage"]


# The tests' images live in the machine's cache, not in the clone: build-images.sh rebuilds an archive only when a
# hash of its inputs changed and keeps buildah's layer cache beside it, so a fresh clone on a machine that built them
# before reuses the 3 GB dependency layer instead of spending minutes on it (a first machine builds everything).
IMAGES_OUT = Path(os.environ.get("GRPO_IMAGES_OUT")
                  or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo-operator" / "images")


def build_images(out: Path | None = None, log: Path | None = None) -> dict[str, Path]:
    """scripts/build-images.sh --variant cpu (seconds when its inputs are unchanged).  GRPO_TEST_IMAGES_DIR: use
    archives built elsewhere (CI's image job) instead."""
    given = os.environ.get("GRPO_TEST_IMAGES_DIR")
    out = Path(given) if given else (out or IMAGES_OUT)
    if not given:
        with open(log or os.devnull, "w") as f:
            subprocess.run(["bash", str(REPO / "scripts" / "build-images.sh"), "--variant", "cpu", "--out", str(out)],
                           check=True, stdout=f, stderr=subprocess.STDOUT, timeout=3600)
    archives = {"operator": out / "grpo-operator.tar", "trainer": out / "grpo-trainer-cpu.tar"}
    for _k, p in archives.items():
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: scripts/build-images.sh --variant cpu --out {out}")
    return archives


@dataclass
class Transcript:
    path: Path
    t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def write(self, text: str) -> None:
        with open(self.path, "a") as f:
            f.write(text.rstrip("\n") + "\n")

    def note(self, text: str) -> None:
        self.write(f"\n# [{time.monotonic() - self.t0:6.1f}s] {text}")


@dataclass
class User:
    """Runs helm and kubectl as a user does, against the node's kubeconfig; records each call in the transcript."""

    node: NodeCluster
    transcript: Transcript
    helm_bin: str = field(default_factory=lambda: os.environ.get("GRPO_TEST_HELM", "helm4"))

    def _env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.node.kubeconfig), "PATH": f"{TOOLS}:{os.environ.get('PATH', '')}",
                "HELM_CACHE_HOME": "/tmp/grpo-journey-helm/cache", "HELM_CONFIG_HOME": "/tmp/grpo-journey-helm/config",
                "HELM_DATA_HOME": "/tmp/grpo-journey-helm/data"}

    def run(self, argv: Sequence[str], *, check: bool = True, input: str | None = None, timeout: float = 300,
            quiet: bool = False) -> subprocess.CompletedProcess[str]:
        t = time.monotonic()
        cp = subprocess.run(list(argv), env=self._env(), text=True, capture_output=True, input=input,
                            timeout=timeout, cwd=REPO)
        if not quiet:
            shown = " ".join(shlex.quote(a) for a in argv).replace(str(REPO) + "/", "").replace(str(TOOLS) + "/", "")
            self.transcript.write(f"$ {shown}    # {time.monotonic() - t:.2f} s, exit {cp.returncode}")
            out = (cp.stdout + cp.stderr).rstrip()
            if out:
                self.transcript.write(out if len(out) < 6000 else out[:3000] + "\n[…]\n" + out[-2000:])
        if check and cp.returncode != 0:
            raise AssertionError(f"{argv[0]} exited {cp.returncode}:\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}")
        return cp

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([str(TOOLS / "kubectl"), *args], **kw)

    def helm(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([str(TOOLS / self.helm_bin), *args], **kw)

    def job_status(self, name: str, namespace: str) -> dict[str, Any]:
        """A GRPOJob's status as kubectl shows it ({} while it has none, or once the job is gone)."""
        return (self.json("get", "grpojob", name, "-n", namespace) or {}).get("status") or {}

    def json(self, *args: str) -> Any:
        cp = self.kubectl(*args, "-o", "json", quiet=True, check=False)
        return json.loads(cp.stdout) if cp.returncode == 0 else None


def tiny_job(name: str, *, max_steps: int, save_steps: int, image: str | None = None, pvc: str = "ckpt",
             cpu: str = "1", memory: str = "3Gi") -> dict[str, Any]:
    """The README's tiny job on 2 nodes × 1 CPU process, as a user writes it for a cluster: model and data from
    ConfigMaps (kubectl create configmap --from-file), checkpoints on a shared PVC."""
    spec: dict[str, Any] = {
        "model": "/models/tiny",
        "dataset": {"name": "/data/arithmetic.jsonl", "split": "train", "promptColumn": "question",
                    "answerColumn": "answer"},
        "rewards": [{"name": "accuracy"}, {"name": "length", "weight": 0.5}],
        "nodes": 2,
        "nprocPerNode": 1,
        # requests below the limit: two pods, the operator and the DNS fit on a 2-core node
        "resources": {"limits": {"cpu": cpu, "memory": memory}, "requests": {"cpu": "500m", "memory": "1Gi"}},
        "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 4, "gradientAccumulationSteps": 1,
                     "maxSteps": max_steps, "maxCompletionLength": 16, "learningRate": 1.0e-4, "loggingSteps": 1,
                     "saveSteps": save_steps, "reportTo": "none", "seed": 0},
        "vllm": {"mode": "none"},
        "output": {"volumeClaimName": pvc, "path": "/ckpt"},
        "runPolicy": {"backoffLimit": 2},
        "template": {
            "volumes": [{"name": "model", "configMap": {"name": "tiny-model"}},
                        {"name": "data", "configMap": {"name": "tiny-data"}}],
            "volumeMounts": [{"name": "model", "mountPath": "/models/tiny", "readOnly": True},
                             {"name": "data", "mountPath": "/data", "readOnly": True}],
        },
    }
    if image:
        spec["image"] = image
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": name}, "spec": spec}


def progress_records(log: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        i = line.find(PROGRESS)
        if i >= 0:
            try:
                out.append(json.loads(line[i + len(PROGRESS):]))
            except ValueError:
                continue
    return out


def storage(user: User, namespace: str, *, size: str = "1Gi") -> None:
    """The PVC `ckpt` of the job: on the local node a `local` PersistentVolume (a directory of the node), elsewhere
    the cluster's default StorageClass (or GRPO_TEST_STORAGE_CLASS)."""
    node = user.node
    if node.external:
        pvc: dict[str, Any] = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                               "metadata": {"name": "ckpt", "namespace": namespace},
                               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}
        if os.environ.get("GRPO_TEST_STORAGE_CLASS"):
            pvc["spec"]["storageClassName"] = os.environ["GRPO_TEST_STORAGE_CLASS"]
        user.kubectl("apply", "-f", "-", input=json.dumps(pvc))
        return
    path = node.volume_dir("ckpt")
    docs = [
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "journey-local"},
         "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "journey-ckpt"},
         "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "journey-local",
                  "local": {"path": str(path)},
                  "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "kubernetes.io/hostname", "operator": "In", "values": [node.node_name()]}]}]}}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt", "namespace": namespace},
         "spec": {"storageClassName": "journey-local", "accessModes": ["ReadWriteOnce"],
                  "resources": {"requests": {"storage": size}}}},
    ]
    user.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))


def model_configmaps(user: User, namespace: str) -> None:
    tiny = REPO / "examples" / "local-tiny"
    user.kubectl("create", "configmap", "tiny-model", "-n", namespace, f"--from-file={tiny / 'model'}")
    user.kubectl("create", "configmap", "tiny-data", "-n", namespace, f"--from-file={tiny / 'data'}")


def install_chart(user: User, *extra: str) -> float:
    """helm install with the chart's defaults (images, RBAC, webhook through its Service); seconds until the
    operator has filled in its webhook configuration."""
    t = time.monotonic()
    user.helm("install", RELEASE, str(CHART), "-n", OP_NAMESPACE, "--create-namespace", "--wait", "--timeout", "5m",
              "--set", "lifecycle.backoffBaseSeconds=1", "--set", "metrics.progressIntervalSeconds=2", *extra,
              timeout=400)
    wait_webhook(user)
    return time.monotonic() - t


def webhook_config_name() -> str:
    return f"{RELEASE}-grpo-operator.grpo.dev"


def wait_webhook(user: User, timeout: float = 120) -> None:
    def filled() -> bool:
        vwc = user.json("get", "validatingwebhookconfiguration", webhook_config_name())
        return bool(vwc and vwc.get("webhooks"))

    wait_for(filled, timeout, 0.5, what="the operator to fill in its ValidatingWebhookConfiguration")
