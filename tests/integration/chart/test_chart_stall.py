"""The chart's lifecycle.stall values: they render into the operator Deployment as the GRPO_STALL_* variables the
operator reads (Settings.from_env → StallPolicy), and values that would declare healthy jobs hung are refused by helm
3 and 4 alike (the schema, and the scrape interval they must exceed)."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_operator.controller.settings import STALL_ENV, Settings, check
from grpo_operator.lifecycle.stall_watch import StallPolicy
from tests.support.helm import CHART, HELMS, helm, objects

CUSTOM = {"floorSeconds": 600, "multiple": 4, "startupSeconds": 7200, "saveSeconds": 3600.5, "evalSeconds": 5400,
          "heartbeatSeconds": 90, "unansweredSeconds": 240, "stackWaitSeconds": 45}
FIELDS = {"floorSeconds": "floor", "multiple": "multiple", "startupSeconds": "startup", "saveSeconds": "save",
          "evalSeconds": "evaluate",
          "heartbeatSeconds": "heartbeat", "unansweredSeconds": "unanswered", "stackWaitSeconds": "stack_wait"}


def _env(helm_bin: str, values: dict[str, Any]) -> dict[str, str]:
    cp = helm(helm_bin, "template", "grpo", str(CHART), "--namespace", "grpo-system", values=values)
    (dep,) = [o for o in objects(cp.stdout) if o["kind"] == "Deployment"]
    return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("helm_bin", HELMS)
@pytest.mark.parametrize("stall", [{}, CUSTOM, {"startupSeconds": 14400}], ids=["defaults", "custom", "one-key"])
def test_stall_values_reach_the_operator(helm_bin: str, stall: dict[str, Any]) -> None:
    """Every StallPolicy setting has its value (no GRPO_STALL_* is left to extraEnv), and the operator reads back
    exactly the policy the values describe; the settings pass the operator's own start-up check."""
    env = _env(helm_bin, {"lifecycle": {"stall": stall}} if stall else {})
    assert sorted(k for k in env if k.startswith("GRPO_STALL_")) == sorted(STALL_ENV.values())
    want = {f: float(getattr(StallPolicy(), f)) for f in FIELDS.values()}
    want.update({FIELDS[k]: float(v) for k, v in stall.items()})
    cfg = Settings.from_env(env)  # the chart's own environment, as the pod gets it
    assert {f: getattr(cfg.policy.stall, f) for f in FIELDS.values()} == want
    assert check(cfg) is None


BAD = [
    ({"lifecycle": {"stall": {"heartbeatSeconds": 5}}}, ["heartbeatSeconds"]),  # two ticks of 2 s: a busy node skips that
    ({"lifecycle": {"stall": {"floorSeconds": 0}}}, ["floorSeconds"]),
    ({"lifecycle": {"stall": {"multiple": 0.5}}}, ["multiple"]),  # a deadline shorter than the slowest step
    ({"lifecycle": {"stall": {"startupSeconds": "1h"}}}, ["startupSeconds"]),
    ({"lifecycle": {"stall": {"startupSecs": 3600}}}, ["startupSecs"]),  # a typo: unknown keys are refused
    # a heartbeat is seen to move once per scrape: a limit under two scrapes fires on one slow scrape
    ({"metrics": {"progressIntervalSeconds": 45}}, ["heartbeatSeconds", "progressIntervalSeconds"]),
    ({"metrics": {"progressIntervalSeconds": 20}, "lifecycle": {"stall": {"unansweredSeconds": 30}}},
     ["unansweredSeconds", "progressIntervalSeconds"]),
]


@pytest.mark.parametrize("helm_bin", HELMS)
@pytest.mark.parametrize("values, words", BAD, ids=[str(b[0]) for b in BAD])
def test_stall_values_that_would_stall_healthy_jobs_are_refused(helm_bin: str, values: dict[str, Any],
                                                                 words: list[str]) -> None:
    cp = helm(helm_bin, "template", "x", str(CHART), values=values, check=False)
    assert cp.returncode != 0, f"{values} accepted"
    for w in words:
        assert w in cp.stderr, f"{values}: {w!r} not in the error:\n{cp.stderr}"


def test_scrapes_off_leave_the_stall_values_alone() -> None:
    """progressIntervalSeconds 0 turns scraping (and so stall detection) off: no interval to compare with."""
    env = _env(HELMS[0], {"metrics": {"progressIntervalSeconds": 0}})
    assert env["GRPO_STALL_HEARTBEAT_SECONDS"] == "60"
    assert check(Settings.from_env(env)) is None


@pytest.mark.parametrize("env, words", [
    ({"GRPO_STALL_HEARTBEAT_SECONDS": "0"}, ["GRPO_STALL_HEARTBEAT_SECONDS", "> 0"]),
    ({"GRPO_STALL_MULTIPLE": "-1"}, ["GRPO_STALL_MULTIPLE"]),
    ({"GRPO_PROGRESS_INTERVAL_SECONDS": "40"}, ["GRPO_STALL_HEARTBEAT_SECONDS", "GRPO_PROGRESS_INTERVAL_SECONDS"]),
    ({"GRPO_STALL_UNANSWERED_SECONDS": "20"}, ["GRPO_STALL_UNANSWERED_SECONDS"]),
])
def test_the_operator_refuses_the_same_without_the_chart(env: dict[str, str], words: list[str]) -> None:
    """Set by hand (extraEnv, a plain Deployment), the operator's start-up check says the same, naming the
    variable, instead of declaring every job hung."""
    problem = check(Settings.from_env({**env, "GRPO_NAMESPACES": "team-a"}))
    assert problem is not None and all(w in problem for w in words), problem
