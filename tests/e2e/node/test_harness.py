"""The node tier's harness (scripts/node/, tests/support/node.py): a real single-node cluster runs pods,
and leaving it - normally, on a failure, or on SIGTERM - leaves the host exactly as it was: no process,
mount, link, iptables rule, cgroup, changed sysctl or file in the kubelet's hard-coded paths.

Local node only (root + scripts/install-test-deps.sh); an external cluster (GRPO_TEST_KUBECONFIG) is not ours
to tear down.  ~1.5 min: two starts (~20 s), scripts/node/check.sh (~20 s), two downs (~6 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.node import (
    DEFAULT_STATE,
    SCRIPTS,
    NodeCluster,
    host_snapshot,
    node_unavailable_reason,
    snapshot_diff,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def local_node_only() -> None:
    if os.environ.get("GRPO_TEST_KUBECONFIG"):
        pytest.skip("GRPO_TEST_KUBECONFIG: the harness tests are about the local node")
    reason = node_unavailable_reason()
    if reason:
        if os.environ.get("GRPO_TEST_REQUIRE_CLUSTER", "") not in ("", "0"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def test_node_runs_pods_and_a_failing_test_leaves_the_host_as_it_was() -> None:
    before = host_snapshot(DEFAULT_STATE)
    assert before["processes"] == [], f"a node is already running: {before['processes']}"
    with pytest.raises(RuntimeError, match="the test failed"):
        with NodeCluster.start() as node:
            # pods, phases, logs, the kubernetes Service, DNS (headless, SRV, upstream), a local PV,
            # kill -9 from the host -> 137, a memory limit -> OOMKilled, exec
            cp = subprocess.run(["bash", str(SCRIPTS / "check.sh")], env=node.env, text=True,
                                capture_output=True, timeout=300)
            assert cp.returncode == 0, cp.stdout + cp.stderr
            assert "9 passed, 0 failed" in cp.stdout or ", 0 failed" in cp.stdout, cp.stdout
            # the snapshot sees what a node changes (else the comparison below could never fail); taken after
            # pods ran, so the kubelet's pod cgroups exist by now whatever the machine's load
            up = host_snapshot(DEFAULT_STATE)
            changed = snapshot_diff(before, up)
            for part in ("processes", "links", "iptables", "mounts"):
                assert part in changed, f"the snapshot does not see the node's {part}"
            # top-level kubepods cgroups may predate this node (an earlier node on the machine), so "seen" is
            # "present" here; the comparison after down.sh still catches any this node leaves
            assert up["cgroups"], "the snapshot does not see the node's cgroups"
            raise RuntimeError("the test failed")
    diff = snapshot_diff(before, host_snapshot(DEFAULT_STATE))
    assert diff == {}, f"down.sh left this behind: {diff}"


CHILD = """
import sys, time
from tests.support.node import NodeCluster
with NodeCluster.start(dns=False) as node:
    node.kubectl("get", "nodes")
    print("UP", flush=True)
    time.sleep(600)   # until the parent's SIGTERM
"""


def test_sigterm_of_the_test_process_takes_the_node_down() -> None:
    """What `timeout` or a cancelled CI job does: SIGTERM.  The node must still be taken down."""
    before = host_snapshot(DEFAULT_STATE)
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # blocks until the child is up (or dies)
        assert line.strip() == "UP", proc.stderr.read()[-3000:]
        assert node_processes_running()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        down_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["bash", str(SCRIPTS / "down.sh")], timeout=300)
    diff = snapshot_diff(before, host_snapshot(DEFAULT_STATE))
    assert diff == {}, f"SIGTERM left this behind: {diff}"
    assert down_s < 60


def node_processes_running() -> bool:
    return bool(host_snapshot(DEFAULT_STATE)["processes"])
