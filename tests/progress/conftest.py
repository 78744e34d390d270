"""Fixtures of the progress/metrics tests: the real control plane (tests/cluster) and the operator tier's helpers
(tests/operator/conftest.py: the operator process, the kubelet played through pods/status)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from cluster.fixtures import controlplane, k8s_namespace, kubeconfig, kubectl  # noqa: E402,F401

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


def operator_helpers():
    """tests/operator/conftest.py as a module of its own name (it is `conftest` there; importing it by that name from
    here would collide with this package's conftest)."""
    name = "grpo_tests_operator_conftest"
    if name in sys.modules:
        return sys.modules[name]
    path = TESTS / "operator" / "conftest.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def offline_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OFFLINE)
    env.update(extra)
    return env
