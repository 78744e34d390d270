"""Shared fixtures (tests/support, as plugins) and the tier markers.

Every test gets the marker of its tier folder — unit, integration or e2e — so one tier runs with either
`pytest tests/unit` or `pytest -m unit` (docs/testing.md). Tests marked `cuda_image` (the CUDA trainer image: a
build of ~10x the CPU image's bytes) run only when a `-m` expression names that marker: any other command,
scripts/test.sh's included, deselects them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# The operator's entry point blocks the official `kubernetes` client for its own process (a setdefault of None in
# sys.modules, cli/grpo_operator.py); tests import that module in-process beside the client's tests, which use the
# client. Imported first, the client stays importable whatever order the test modules are collected in.
try:
    import kubernetes  # noqa: F401
except ImportError:  # an install without the client: its tests do not run
    pass

pytest_plugins = ["tests.support.cluster.fixtures", "tests.support.operator", "tests.support.trainer"]

TIERS = ("unit", "integration", "e2e")
OPT_IN = "cuda_image"
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            tier = Path(str(item.path)).resolve().relative_to(_HERE).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    if OPT_IN not in (config.getoption("markexpr") or ""):
        drop = [i for i in items if i.get_closest_marker(OPT_IN)]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [i for i in items if not i.get_closest_marker(OPT_IN)]
