"""A hung job found and recovered on the real node, as a platform team and a user meet it:

  helm install the chart with `lifecycle.stall.*` values (short limits: the tiny job's steps take seconds)
  → a 2-node CPU job whose custom reward function (a ConfigMap on PYTHONPATH, as docs/trainer.md says) never
    returns in its first attempt, after a checkpoint
  → `Stalled=True`, reason Rewards, the function named in the condition and in a Warning Event; every rank's
    stacks on the PV (stalls/attempt-0/rank-R.txt)
  → runPolicy.onStall Restart (the default): a gang restart counted against backoffLimit, the new attempt resumes
    from the checkpoint on the PV and the job Succeeds.

~6 min cold (the images are built first), ~3 min with them built. Same node and fixtures as test_journey.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.journey import OP_NAMESPACE, RELEASE, User, install_chart, model_configmaps, storage, tiny_job
from tests.support.node import REPO, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
NS = "stall"
TRANSCRIPT_FILE = "stall-transcript.txt"
TIMINGS: dict[str, float] = {}
SAVE_STEPS, MAX_STEPS = 2, 6
STALL_VALUES = {"lifecycle": {"stall": {"floorSeconds": 20, "heartbeatSeconds": 10, "stackWaitSeconds": 20}}}

# Blocks in attempt 0 on every rank from its 4th call (step 4: checkpoint-2 is on the PV); later attempts score.
HANGING_REWARD = '''
import os
import threading

CALLS = []


def score_then_hang_in_attempt_0(prompts, completions, **kwargs):
    CALLS.append(1)
    if os.environ.get("GRPO_ATTEMPT") == "0" and len(CALLS) > 3:
        threading.Event().wait()
    return [0.0 for _ in completions]
'''


@pytest.fixture(scope="module")
def stall_release(user: User) -> Iterator[User]:
    values = REPO / "out" / "journey" / "stall-values.yaml"
    values.parent.mkdir(parents=True, exist_ok=True)
    values.write_text(yaml.safe_dump(STALL_VALUES))
    user.transcript.note("helm install with lifecycle.stall values: a 20 s floor, a 10 s heartbeat limit")
    TIMINGS["helm_install_s"] = install_chart(user, "-f", str(values))
    dep = user.json("get", "deployment", "-n", OP_NAMESPACE, "-l", "app.kubernetes.io/name=grpo-operator")
    env = {e["name"]: e.get("value") for e in dep["items"][0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["GRPO_STALL_FLOOR_SECONDS"], env["GRPO_STALL_HEARTBEAT_SECONDS"]) == ("20", "10"), env
    user.kubectl("create", "namespace", NS)
    yield user


def test_a_reward_that_never_returns_is_stalled_dumped_restarted_and_resumed(stall_release: User) -> None:
    user, tr, node = stall_release, stall_release.transcript, stall_release.node
    model_configmaps(user, NS)
    storage(user, NS)
    mods = REPO / "out" / "journey" / "hang_rewards.py"
    mods.write_text(HANGING_REWARD)
    user.kubectl("create", "configmap", "hang-rewards", "-n", NS, f"--from-file={mods}")
    job = tiny_job("hang", max_steps=MAX_STEPS, save_steps=SAVE_STEPS)
    job["spec"]["rewards"] = [{"function": "hang_rewards:score_then_hang_in_attempt_0"}]
    tmpl = job["spec"]["template"]
    tmpl["volumes"].append({"name": "rewards", "configMap": {"name": "hang-rewards"}})
    tmpl["volumeMounts"].append({"name": "rewards", "mountPath": "/rewards", "readOnly": True})
    tmpl["env"] = [{"name": "PYTHONPATH", "value": "/rewards"}]
    manifest = REPO / "out" / "journey" / "hang.yaml"
    manifest.write_text(yaml.safe_dump(job, sort_keys=False))
    tr.write(manifest.read_text())
    t_apply = time.monotonic()
    user.kubectl("apply", "-n", NS, "-f", str(manifest))

    def stalled() -> dict[str, Any] | None:
        s = user.job_status("hang", NS)
        if s.get("phase") in ("Failed", "Succeeded"):
            raise AssertionError(f"finished without a stall: {json.dumps(s)[:3000]}")
        cond = next((c for c in s.get("conditions", []) if c["type"] == "Stalled"), None)
        # the diagnosis: True while the stacks come in, then False with it kept once the gang restarts
        return cond if cond and "score_then_hang_in_attempt_0" in cond.get("message", "") else None

    try:
        cond = wait_for(stalled, 420, 1.0, what="Stalled with the reward function in its message")
        TIMINGS["apply_to_stalled_s"] = time.monotonic() - t_apply
        tr.note(f"Stalled ({cond['status']}, {cond['reason']}): {cond['message'][:600]}")
        assert cond["reason"] in ("Rewards", "Stalled"), cond  # Rewards while True; Stalled once restarted
        events = (user.json("get", "events", "-n", NS, "--field-selector", "reason=Stalled") or {}).get("items", [])
        assert events and events[0]["type"] == "Warning" and "Rewards" in events[0]["message"] \
            and "score_then_hang_in_attempt_0" in events[0]["message"], events

        def finished() -> dict[str, Any] | None:
            s = user.job_status("hang", NS)
            if s.get("phase") == "Failed":
                raise AssertionError(f"the job failed: {json.dumps(s)[:3000]}")
            return s if s.get("phase") == "Succeeded" else None

        final = wait_for(finished, 600, 1.0, what="Succeeded after the gang restart")
        TIMINGS["apply_to_succeeded_s"] = time.monotonic() - t_apply
    finally:
        user.kubectl("get", "grpojob,pods", "-n", NS, "-o", "wide", check=False)
        user.kubectl("describe", "grpojob", "hang", "-n", NS, check=False)
        user.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False)
        user.kubectl("logs", "-n", OP_NAMESPACE, f"deployment/{RELEASE}-grpo-operator", "--tail=150", check=False)
    assert final.get("restarts", 0) >= 1 and final.get("lastFailureReason") == "Stalled", final
    assert (final.get("progress") or {}).get("step") == MAX_STEPS, final
    resumed = "".join(user.kubectl("logs", "-n", NS, p["metadata"]["name"], "-c", "trainer", quiet=True,
                                   check=False).stdout
                      for p in (user.json("get", "pods", "-n", NS, "-l", "grpo.dev/job-name=hang,grpo.dev/attempt=1")
                                or {}).get("items", []))
    assert '"resumedFrom":"/ckpt/hang/checkpoint-' in resumed, resumed[-3000:]
    kept = next(c for c in final["conditions"] if c["type"] == "Stalled")
    assert kept["status"] == "False" and "score_then_hang_in_attempt_0" in kept["message"], kept
    if not node.external:  # the PV is a directory of the node: the stacks and the checkpoints are there
        out = node.state / "volumes" / "ckpt" / "hang"
        for rank in (0, 1):
            text = (out / "stalls" / "attempt-0" / f"rank-{rank}.txt").read_text()
            assert "score_then_hang_in_attempt_0" in text and "_calculate_rewards" in text, text[:3000]
        ckpts = sorted(p.name for p in out.glob("checkpoint-*"))
        tr.write(f"checkpoints on the PV: {ckpts}; timings {TIMINGS}")
        assert f"checkpoint-{MAX_STEPS}" in ckpts, ckpts
    print(f"\nstall journey: {TIMINGS}")
