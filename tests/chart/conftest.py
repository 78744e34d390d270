"""Fixtures of the chart tier: helm binaries, rendering, and the shared cluster fixtures (tests/cluster)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from cluster.fixtures import (celserver, controlplane, controlplane_factory, k8s_namespace,  # noqa: E402,F401
                              kubeconfig, kubectl)
