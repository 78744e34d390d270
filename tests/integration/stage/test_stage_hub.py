"""grpo_trainer.stage against the local Hub emulator (tests/support/hub.py): what it downloads, what it skips, how
it fails, and that the trainer's own offline loading finds everything afterwards. Each run is a subprocess, as in
the initializer pod: HF_ENDPOINT is read once, at import time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_trainer import contract
from tests.support.hub import HubEmulator
from tests.support.trainer import REPO, TINY_DATA, TINY_MODEL

SAFETENSORS_SIZE = (TINY_MODEL / "model.safetensors").stat().st_size


@pytest.fixture
def hub():
    emulator = HubEmulator()
    emulator.add_model("org/tiny", TINY_MODEL)
    emulator.add_dataset("org/data", {"data/train.jsonl": TINY_DATA.read_bytes()})
    with emulator:
        yield emulator


def _env(hub: HubEmulator, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE") and k != "HF_TOKEN"}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), PYTHONPATH=f"{REPO / 'trainer_image'}",
               GRPO_TERMINATION_LOG=str(home.parent / "termination-log"), GRPO_STAGE_BACKOFF_SECONDS="0.05",
               HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
    env.update(extra)
    return env


def stage(hub: HubEmulator, tmp_path: Path, *, model="org/tiny", dataset="org/data", training=None, rewards=None,
          **env: str) -> tuple[int, list[dict], str]:
    doc = {"schemaVersion": 1, "model": model, "dataset": {"name": dataset, "split": "train"},
           "rewards": rewards or [{"name": "accuracy"}], "training": training or {}, "outputDir": str(tmp_path / "out")}
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(doc))
    p = subprocess.run([sys.executable, "-m", contract.STAGE_MODULE, "--config", str(cfg)], capture_output=True,
                       text=True, timeout=300, env=_env(hub, tmp_path / "hf-home", **env))
    records = [json.loads(line[len(contract.STAGE_PREFIX):]) for line in p.stdout.splitlines()
               if line.startswith(contract.STAGE_PREFIX)]
    return p.returncode, records, p.stderr


def _got(hub: HubEmulator, what: str) -> list[str]:
    return sorted(r.path.rsplit("/", 1)[-1] for r in hub.requests("GET", what))


def test_stage_then_trainer_loads_offline_and_a_second_run_downloads_nothing(hub, tmp_path):
    code, records, err = stage(hub, tmp_path)
    assert code == 0, err
    done = records[-1]
    assert done["event"] == "done" and len(done["staged"]) == 2
    model = next(r for r in records if r["event"] == "staged" and r["item"].startswith("model"))
    assert model["bytes"] == model["totalBytes"] >= SAFETENSORS_SIZE and model["files"] == model["totalFiles"] == 6
    assert "model.safetensors" in _got(hub, "/org/tiny/resolve/")
    assert hub.requests("GET", "/datasets/org/data/resolve/")  # the data file itself

    hub.clear_log()
    code, records, err = stage(hub, tmp_path)
    assert code == 0, err
    assert records[-1]["cached"] and not records[-1]["staged"]
    assert hub.requests() == []  # no request at all: the markers say everything is there

    # the trainer's own loading code, offline, on the same HF_HOME, at the commits the stage step recorded
    assert [(r["kind"], r["repo"], r["revision"]) for r in done["revisions"]] == \
        [("model", "org/tiny", "main"), ("dataset", "org/data", "main")]
    assert records[-1]["revisions"] == done["revisions"]  # the cached run names the same commits
    probe = ("import json, sys\nfrom grpo_trainer import data, pins\nfrom grpo_trainer.config import DatasetSpec\n"
             "p = pins.from_env(); rev = pins.model_revision(p, 'org/tiny')\n"
             "tok = data.load_tokenizer('org/tiny', revision=rev); m = data.load_model('org/tiny', revision=rev)\n"
             "ds = data.load_dataset(DatasetSpec(name='org/data', split='train'), pins.dataset_cache_dir(p, 'org/data'))\n"
             "print(json.dumps({'rows': len(ds), 'chat': data.has_chat_template(tok), 'params': m.num_parameters()}))")
    # the pods' layout (render/cache.py): HF_HOME elsewhere, the Hub cache and the datasets cache from the claim
    home = tmp_path / "hf-home"
    env = _env(hub, tmp_path / "pod-home", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_CACHE=str(home / "hub"), HF_DATASETS_CACHE=str(home / "datasets"),
               **{contract.STAGED_REVISIONS_ENV: json.dumps(done["revisions"])})
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["rows"] == 64 and out["chat"] is True and out["params"] > 0
    assert hub.requests() == []


def test_allow_patterns_fetch_only_what_loading_needs(hub, tmp_path):
    files = {p.name: p.read_bytes() for p in TINY_MODEL.iterdir()}
    files |= {"pytorch_model.bin": b"x" * 1000, "modeling_tiny.py": b"# code\n", "README.md": b"# card\n",
              "onnx/model.onnx": b"y" * 500, "original/consolidated.pth": b"z" * 500}
    hub.add_model("org/custom", files)
    code, _, err = stage(hub, tmp_path, model="org/custom")
    assert code == 0, err
    got = _got(hub, "/org/custom/resolve/")
    assert got == sorted(p.name for p in TINY_MODEL.iterdir())  # no .bin beside safetensors, no .py, .onnx, .md

    code, _, err = stage(hub, tmp_path / "trusted", model="org/custom", training={"trust_remote_code": True})
    assert code == 0, err
    assert "modeling_tiny.py" in _got(hub, "/org/custom/resolve/")


def test_revision_is_pinned(hub, tmp_path):
    old = hub.add_model("org/pinned", {**{p.name: p.read_bytes() for p in TINY_MODEL.iterdir()},
                                       "config.json": (TINY_MODEL / "config.json").read_bytes()}, ref="v1")
    new = hub.add_model("org/pinned", {"config.json": b"{}"}, ref="main")
    code, records, err = stage(hub, tmp_path, model="org/pinned", training={"model_init_kwargs": {"revision": "v1"}})
    assert code == 0, err
    assert any(r.get("commit") == old for r in records)
    resolves = [r.path for r in hub.requests(path_contains="/org/pinned/resolve/")]
    assert resolves and all(f"/resolve/{old}/" in p for p in resolves) and not any(new in p for p in resolves)
    folder = tmp_path / "hf-home" / "hub" / "models--org--pinned"
    assert (folder / "snapshots" / old / "model.safetensors").exists()
    # downloaded by commit: no ref is written (the pods load the commit itself, status.stagedRevisions)
    assert not (folder / "refs").exists()
    assert records[-1]["revisions"] == [{"kind": "model", "repo": "org/pinned", "revision": "v1", "commit": old},
                                        {"kind": "dataset", "repo": "org/data", "revision": "main",
                                         "commit": records[-1]["revisions"][1]["commit"]}]


def test_a_cut_connection_resumes_with_a_range_request(hub, tmp_path):
    # huggingface_hub 1.33 writes what it received in 10 MiB chunks (DOWNLOAD_CHUNK_SIZE) and, on a cut, resumes from
    # the last whole chunk with a Range request, in the same process (its .incomplete files are per process)
    weights = bytes(range(256)) * (16 * 4096)  # 16 MiB
    hub.add_model("org/big", {"config.json": b"{}", "model.safetensors": weights})
    hub.cut("model.safetensors", after_bytes=12_000_000)
    code, records, err = stage(hub, tmp_path, model="org/big", dataset=str(TINY_DATA))
    assert code == 0, err
    gets = hub.requests("GET", "/org/big/resolve/")
    gets = [r for r in gets if r.path.endswith("model.safetensors")]
    chunk = 10 * 2**20
    assert [(r.range, r.status) for r in gets] == [(None, -1), (f"bytes={chunk}-", 206)]
    assert gets[0].sent == 12_000_000 and gets[1].sent == len(weights) - chunk
    staged = next(r for r in records if r["event"] == "staged")
    assert staged["bytes"] == staged["totalBytes"] == len(weights) + 2
    blob = tmp_path / "hf-home" / "hub" / "models--org--big" / "snapshots" / staged["commit"] / "model.safetensors"
    assert blob.read_bytes() == weights


def test_gated_repo_is_permanent_and_a_token_opens_it(hub, tmp_path):
    hub.require_token("org/tiny", "hf_secret")
    code, _, err = stage(hub, tmp_path, dataset=str(TINY_DATA))
    assert code == contract.HUB_DENIED, err
    assert "gated" in err and "hfTokenSecretRef" in err
    assert contract.exit_reason(code) == "HubAccessDenied" and not contract.is_retryable(code)
    assert len(hub.requests(path_contains="org/tiny")) == 1  # not retried
    assert "HubAccessDenied" not in (tmp_path / "termination-log").read_text()  # the message, for the condition
    code, _, err = stage(hub, tmp_path, dataset=str(TINY_DATA), HF_TOKEN="hf_secret")
    assert code == 0, err
    assert all(r.authorization == "Bearer hf_secret" for r in hub.requests(path_contains="org/tiny")[1:])


def test_not_found_is_permanent(hub, tmp_path):
    code, _, err = stage(hub, tmp_path, model="org/tyop", dataset=str(TINY_DATA))
    assert code == contract.HUB_NOT_FOUND and "org/tyop" in err and "no such repo" in err, err
    assert len(hub.requests(path_contains="org/tyop")) == 1
    code, _, err = stage(hub, tmp_path, dataset="org/nodata")
    assert code == contract.HUB_NOT_FOUND, err


def test_server_errors_are_retried_with_backoff_then_retryable(hub, tmp_path):
    hub.fail("/api/models/org/tiny/revision/main", 500, times=2)
    code, records, err = stage(hub, tmp_path, dataset=str(TINY_DATA))
    assert code == 0, err
    retries = [r for r in records if r["event"] == "retry"]
    assert [r["delaySeconds"] for r in retries] == [0.05, 0.1] and "500" in retries[0]["error"]

    hub.fail("/api/models/org/tiny/revision/main", 503, times=100)
    code, records, err = stage(hub, tmp_path / "again", dataset=str(TINY_DATA), GRPO_STAGE_ATTEMPTS="3")
    assert code == contract.TRANSIENT_IO and contract.is_retryable(code), err
    assert "failed 3 times" in err
    assert len([r for r in records if r["event"] == "retry"]) == 2


def test_local_paths_download_nothing(hub, tmp_path):
    code, records, err = stage(hub, tmp_path, model=str(TINY_MODEL), dataset=str(TINY_DATA))
    assert code == 0, err
    assert records[-1]["staged"] == [] and hub.requests() == []


def test_reward_models_are_staged(hub, tmp_path):
    hub.add_model("org/reward", TINY_MODEL)
    code, records, err = stage(hub, tmp_path, dataset=str(TINY_DATA),
                               rewards=[{"name": "accuracy"}, {"model": "org/reward", "weight": 0.5}])
    assert code == 0, err
    assert records[-1]["staged"] == ["model org/tiny@main", "model org/reward@main"]
    assert "model.safetensors" in _got(hub, "/org/reward/resolve/")


def test_run_local_with_spec_cache_stages_then_trains_offline(hub, tmp_path):
    """`grpojob run --local` with spec.cache: the stage step fetches from the emulator, the trainers read the cache
    offline (no request while training), and a second run downloads nothing."""
    import yaml

    job = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "cached"},
           "spec": {"model": "org/tiny", "dataset": {"name": "org/data", "promptColumn": "question",
                                                     "answerColumn": "answer"},
                    "rewards": [{"name": "accuracy"}], "nprocPerNode": 1, "cache": {"volumeClaimName": "hf-cache"},
                    "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2, "maxSteps": 1,
                                 "maxCompletionLength": 8, "reportTo": "none", "saveSteps": 10, "loggingSteps": 1}}}
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(job))
    env = _env(hub, tmp_path / "user-hf-home", PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'trainer_image'}",
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "grpo_operator.cli.grpojob", "run", "--local", str(spec_file), "--no-progress",
           "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "out"), "--timeout", "600"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=700, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "grpojob: staged 2, already cached 0" in p.stderr
    downloads = len(hub.requests())
    assert downloads > 0 and hub.requests("GET", "model.safetensors")
    hub.clear_log()
    p = subprocess.run(cmd[:-4] + ["--output-dir", str(tmp_path / "out2"), "--timeout", "600"], capture_output=True,
                       text=True, timeout=700, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "grpojob: staged 0, already cached 2" in p.stderr
    assert hub.requests() == []  # neither the stage step nor the offline trainers reached the Hub
