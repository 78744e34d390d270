"""The node tier's fixtures (tests/e2e/node/test_journey.py, test_cache_journey.py): the cluster, the transcript,
the images built and imported, the chart installed. Module-scoped: each module gets its own node (torn down at its
end, whatever happens). A module may set NS (its namespace, default "journey"), TIMINGS (a dict the fixtures add
their timings to), TRANSCRIPT_ENV and TRANSCRIPT_FILE (where its transcript goes, default
$GRPO_JOURNEY_TRANSCRIPT or out/journey/transcript.txt)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.journey import (
    OP_NAMESPACE,
    RELEASE,
    Transcript,
    User,
    build_images,
    chart_images,
    install_chart,
)
from tests.support.node import REPO, NodeCluster, NodeUnavailable, node_unavailable_reason


def _timings(request: pytest.FixtureRequest) -> dict[str, float]:
    return getattr(request.module, "TIMINGS", {})


def _ns(request: pytest.FixtureRequest) -> str:
    return str(getattr(request.module, "NS", "journey"))


@pytest.fixture(scope="module")
def node(request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    if not os.environ.get("GRPO_TEST_KUBECONFIG"):
        reason = node_unavailable_reason()
        if reason:
            if os.environ.get("GRPO_TEST_REQUIRE_CLUSTER", "") not in ("", "0"):
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)
    try:
        with NodeCluster.start() as n:
            yield n
            _timings(request).update({f"node_{k}": v for k, v in n.timings.items()})
    except NodeUnavailable as exc:  # pragma: no cover - raced with the check above
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def transcript(request: pytest.FixtureRequest) -> Transcript:
    env = getattr(request.module, "TRANSCRIPT_ENV", "GRPO_JOURNEY_TRANSCRIPT")
    default = REPO / "out" / "journey" / getattr(request.module, "TRANSCRIPT_FILE", "transcript.txt")
    return Transcript(Path(os.environ.get(env, default)))


@pytest.fixture(scope="module")
def user(request: pytest.FixtureRequest, node: NodeCluster, transcript: Transcript) -> Iterator[User]:
    timings = _timings(request)
    u = User(node, transcript)
    op_image, trainer_image = chart_images()
    if node.external:
        transcript.note(f"external cluster ({node.kubeconfig}): images {op_image}, {trainer_image} must be loaded")
    else:
        t = time.monotonic()
        archives = build_images(log=transcript.path.with_name("build-images.log"))
        timings["build_images_s"] = time.monotonic() - t
        timings["import_images_s"] = node.import_images([archives["operator"], archives["trainer"]])
        have = node.images()
        assert op_image in have and trainer_image in have, f"imported images: {sorted(have)}"
        transcript.note(f"images imported in {timings['import_images_s']:.1f} s: {op_image}, {trainer_image}")
    u.kubectl("get", "nodes", "-o", "wide")
    yield u
    # leave an external cluster as we found it (our own node is torn down whole)
    if node.external:
        u.kubectl("delete", "namespace", _ns(request), "--wait=false", check=False)
        u.helm("uninstall", RELEASE, "-n", OP_NAMESPACE, check=False)


@pytest.fixture(scope="module")
def release(request: pytest.FixtureRequest, user: User) -> Iterator[User]:
    ns = _ns(request)
    user.transcript.note("helm install: the chart with its defaults (images, RBAC, webhook through its Service)")
    _timings(request)["helm_install_s"] = install_chart(user)
    user.kubectl("get", "pods,svc,validatingwebhookconfiguration,mutatingwebhookconfiguration", "-n", OP_NAMESPACE)
    user.kubectl("create", "namespace", ns)
    yield user
    # what the pods said, for the transcript's reader (the node's logs go with down.sh)
    pods_dir = user.transcript.path.with_name("pods")
    pods_dir.mkdir(exist_ok=True)
    for pns in (ns, OP_NAMESPACE):
        items: list[dict[str, Any]] = (user.json("get", "pods", "-n", pns) or {}).get("items", [])
        for p in items:
            name = p["metadata"]["name"]
            (pods_dir / f"{pns}_{name}.log").write_text(
                user.kubectl("logs", "-n", pns, name, "--all-containers", quiet=True, check=False).stdout)
    user.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False)
