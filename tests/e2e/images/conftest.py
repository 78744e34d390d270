"""Fixtures of the image contract tests: the images built (or reused from build-images.sh's cache), unpacked."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.journey import IMAGES_OUT

from . import podrun

REPO = podrun.REPO
OUT = IMAGES_OUT
BUILD_TIMEOUT = 1500  # a cold build is ~7 min here (docs/performance.md); cached, seconds


@pytest.fixture(scope="session")
def built_images() -> dict[str, Path]:
    """scripts/build-images.sh --variant cpu: cold it builds both images, then only what changed."""
    if os.geteuid() != 0:
        if os.environ.get("GRPO_SKIP_IMAGE_TESTS") == "1":
            pytest.skip("GRPO_SKIP_IMAGE_TESTS=1: image contract tests skipped on purpose")
        pytest.fail("the image contract tests build images with mmdebstrap + buildah and start them with runc: "
                    "run them as root (CI does), or set GRPO_SKIP_IMAGE_TESTS=1 to skip them on purpose")
    proc = subprocess.run(["timeout", "-k", "10", str(BUILD_TIMEOUT), "bash", str(REPO / "scripts" / "build-images.sh"),
                           "--variant", "cpu", "--out", str(OUT)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BUILD_TIMEOUT + 60)
    assert proc.returncode == 0, f"build-images.sh failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}"
    images = {"operator": OUT / "grpo-operator.tar", "trainer": OUT / "grpo-trainer-cpu.tar"}
    for p in images.values():
        assert p.is_file(), f"build-images.sh did not write {p}:\n{proc.stdout[-2000:]}"
    return images


@pytest.fixture(scope="session")
def unpacked(built_images) -> dict[str, tuple[Path, dict]]:
    """name → (root filesystem, image info {names, config, layers})."""
    cache = OUT / ".cache" / "test-rootfs"
    cache.mkdir(parents=True, exist_ok=True)
    return {k: (podrun.rootfs(p, cache), podrun.inspect(p)) for k, p in built_images.items()}
