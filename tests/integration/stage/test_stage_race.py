"""Several download pods on one shared cache at once (issue 27, items 8 and 9): real `python -m grpo_trainer.stage`
processes against the Hub emulator (tests/support/hub.py), then the trainer's own preparation code (train._prepare:
the policy's revision, the reward models, the tokenizer, the dataset), offline, with the commits each staging
recorded, as the operator gives them to the pods (contract.STAGED_REVISIONS_ENV)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from grpo_trainer import contract
from tests.support.hub import HubEmulator
from tests.support.stage_runs import ROWS, StageRun, env_for, model_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
def job_config(folder: Path, revision: str) -> Path:
    """A job's trainer config (docs/trainer-config.md) whose policy and reward model come from org/moving."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"schemaVersion": 1, "model": "org/moving",
           "dataset": {"name": "org/rows", "split": "train", "promptColumn": "question", "answerColumn": "answer"},
           "rewards": [{"name": "accuracy"}, {"model": "org/moving", "weight": 0.5}],
           "training": {"model_init_kwargs": {"revision": revision}, "per_device_train_batch_size": 2,
                        "num_generations": 2, "max_steps": 1, "report_to": "none"},
           "vllm": {"mode": "none"}, "outputDir": str(folder / "out")}
    path = folder / "config.json"
    path.write_text(json.dumps(doc))
    return path


def load_as_the_trainer(hub: HubEmulator, home: Path, config: Path, revisions: list[dict[str, Any]]) -> dict:
    """The trainer's preparation in a pod of this job: offline, the cache read from `home`, the commits pinned."""
    probe = ("import json, sys\nfrom transformers import AutoConfig\nfrom grpo_trainer import config, train\n"
             "cfg = config.load(sys.argv[1])\n"
             "tok, rewards, (ds, _eval), args, revision, trust = train._prepare(cfg, cuda=False)\n"
             "mark = AutoConfig.from_pretrained(cfg.model, **{'revision': revision}).grpo_test_mark\n"
             "rm = [getattr(f, 'config', None) for f in rewards][1]\n"
             "print(json.dumps({'revision': revision, 'mark': mark, 'rows': len(ds), 'reward_mark': rm.grpo_test_mark,"
             " 'reward_tokenizer': train.rewards.processing_classes(rewards)[1] is not None}))")
    pod_home = config.parent / "pod-home"
    env = env_for(hub, pod_home, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                  HF_HUB_CACHE=str(home / "hub"), HF_DATASETS_CACHE=str(home / "datasets"),
                  **{contract.STAGED_REVISIONS_ENV: json.dumps(revisions)})
    p = subprocess.run([sys.executable, "-c", probe, str(config)], capture_output=True, text=True, timeout=300,
                       env=env, cwd=config.parent)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def commit_of(done: dict[str, Any], kind: str) -> str:
    return next(r["commit"] for r in done["revisions"] if r["kind"] == kind)


def test_jobs_staging_one_repo_at_once_while_main_moves_each_load_their_own_commit(tmp_path):
    """Issue 27, item 8: `snapshot_download(revision="main")` rewrote refs/main before downloading while the markers
    were per revision, so job B staging the repo after `main` moved made job A's trainers load a partial or different
    snapshot. Here job A stages `main`; while its weights download, `main` moves (model and dataset); job B stages
    `main` and job C the tag `v1`, all three into one cache at once. Each records the commits it staged, and each
    job's trainer code loads exactly those: the policy, the reward model and its tokenizer, and the dataset."""
    hub = HubEmulator()
    m1 = hub.add_model("org/moving", model_files("m1"))
    v1 = hub.add_model("org/moving", model_files("v1"), ref="v1")
    d1 = hub.add_dataset("org/rows", {"data/train.jsonl": b"".join(ROWS)})
    home = tmp_path / "cache"
    hold = hub.hold("model.safetensors")
    with hub:
        try:
            a = StageRun(job_config(tmp_path / "a", "main"), env_for(hub, home), tmp_path / "a" / "termination")
            hold.arrived.wait(120)  # job A resolved main and is in the middle of its weights
            assert a.wait_for(lambda r: r.get("event") == "start")["commit"] == m1
            m2 = hub.add_model("org/moving", model_files("m2"))  # main moves, for the model and the dataset
            d2 = hub.add_dataset("org/rows", {"data/train.jsonl": b"".join(ROWS[:32])})
            b = StageRun(job_config(tmp_path / "b", "main"), env_for(hub, home), tmp_path / "b" / "termination")
            c = StageRun(job_config(tmp_path / "c", "v1"), env_for(hub, home), tmp_path / "c" / "termination")
            assert b.wait_for(lambda r: r.get("event") == "start")["commit"] == m2
            assert c.wait_for(lambda r: r.get("event") == "start")["commit"] == v1
        finally:
            hold.release()
        done = {"a": a.finish(), "b": b.finish(), "c": c.finish()}
        assert [commit_of(done[j], "model") for j in "abc"] == [m1, m2, v1]
        assert commit_of(done["b"], "dataset") == d2
        # the termination message (what the operator records in status.stagedRevisions) names the same commits
        for j in "abc":
            line = (tmp_path / j / "termination").read_text().strip()
            assert json.loads(line[len(contract.STAGE_PREFIX):])["revisions"] == done[j]["revisions"]
        assert not (home / "hub" / "models--org--moving" / "refs").exists()  # nothing moves under a running job
        hub.clear_log()
        rows = {d1: 64, d2: 32}
        for j, mark in (("a", "m1"), ("b", "m2"), ("c", "v1")):
            got = load_as_the_trainer(hub, home, tmp_path / j / "config.json", done[j]["revisions"])
            assert got == {"revision": commit_of(done[j], "model"), "mark": mark, "reward_mark": mark,
                           "reward_tokenizer": True, "rows": rows[commit_of(done[j], "dataset")]}, j
        assert hub.requests() == []  # the trainers read the cache offline


def test_two_download_pods_racing_on_one_cache_both_succeed(tmp_path):
    """Issue 27, item 9: two download pods staging the same job into one cache at the same moment collided on the
    marker's temporary file and the loser exited 1 (permanent: the job failed). Both succeed, name the same commits,
    and leave no temporary file; a third run finds everything cached without a request."""
    hub = HubEmulator()
    m1 = hub.add_model("org/moving", model_files("m1"))
    hub.add_dataset("org/rows", {"data/train.jsonl": b"".join(ROWS)})
    home = tmp_path / "cache"
    hold = hub.hold("model.safetensors")  # both get as far as the weights before either writes a marker
    with hub:
        try:
            runs = [StageRun(job_config(tmp_path / j, "main"), env_for(hub, home), tmp_path / j / "termination")
                    for j in ("x", "y")]
            for run in runs:
                assert run.wait_for(lambda r: r.get("event") == "start")["commit"] == m1
        finally:
            hold.release()
        x, y = (run.finish() for run in runs)
        assert x["revisions"] == y["revisions"] and commit_of(x, "model") == m1
        assert not [p.name for p in (home / "grpo-stage").iterdir() if not p.name.endswith(".json")]
        hub.clear_log()
        third = StageRun(job_config(tmp_path / "z", "main"), env_for(hub, home), tmp_path / "z" / "termination")
        done = third.finish()
        assert done["staged"] == [] and done["revisions"] == x["revisions"] and hub.requests() == []
