"""Fixtures of the image contract tests: the images built (or reused from build-images.sh's cache), unpacked."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.journey import IMAGES_OUT

from . import podrun

REPO = podrun.REPO
OUT = IMAGES_OUT
# A cold CPU build is 7-23 min here (idle to loaded), a cold CUDA build much longer (docs/performance.md); cached, seconds.
BUILD_TIMEOUT = {"cpu": 2400, "cuda": 6000}
# The trainer's variants. The CUDA image (~10x the bytes) runs only when asked for: `-m cuda_image`
# (tests/conftest.py deselects it otherwise; docs/testing.md).
VARIANTS = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda_image)]


def build(variant: str) -> dict[str, Path]:
    """scripts/build-images.sh --variant VARIANT: cold it builds both images, then only what changed."""
    if os.geteuid() != 0:
        if os.environ.get("GRPO_SKIP_IMAGE_TESTS") == "1":
            pytest.skip("GRPO_SKIP_IMAGE_TESTS=1: image contract tests skipped on purpose")
        pytest.fail("the image contract tests build images with mmdebstrap + buildah and start them with runc: "
                    "run them as root (CI does), or set GRPO_SKIP_IMAGE_TESTS=1 to skip them on purpose")
    timeout = BUILD_TIMEOUT[variant]
    proc = subprocess.run(["timeout", "-k", "10", str(timeout), "bash", str(REPO / "scripts" / "build-images.sh"),
                           "--variant", variant, "--out", str(OUT)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout + 60)
    assert proc.returncode == 0, f"build-images.sh failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}"
    images = {"operator": OUT / "grpo-operator.tar", "trainer": OUT / f"grpo-trainer-{variant}.tar"}
    for p in images.values():
        assert p.is_file(), f"build-images.sh did not write {p}:\n{proc.stdout[-2000:]}"
    return images


def unpack(archive: Path) -> tuple[Path, dict]:
    cache = OUT / ".cache" / "test-rootfs"
    cache.mkdir(parents=True, exist_ok=True)
    return podrun.rootfs(archive, cache), podrun.inspect(archive)


@pytest.fixture(scope="session")
def built_images() -> dict[str, Path]:
    return build("cpu")


@pytest.fixture(scope="session")
def unpacked(built_images) -> dict[str, tuple[Path, dict]]:
    """name → (root filesystem, image info {names, config, layers}) of the operator and the CPU trainer."""
    return {k: unpack(p) for k, p in built_images.items()}


@dataclass(frozen=True)
class Trainer:
    variant: str
    root: Path
    info: dict


@pytest.fixture(scope="session", params=VARIANTS)
def trainer(request) -> Trainer:
    """The trainer image of each variant, unpacked (the CPU one is the `unpacked` fixture's)."""
    if request.param == "cpu":
        return Trainer("cpu", *request.getfixturevalue("unpacked")["trainer"])
    return Trainer(request.param, *unpack(build(request.param)["trainer"]))
