"""grpo_trainer.stage, the pure parts: what a config stages, the allow-patterns, markers, retries and error mapping.
(The downloads themselves: tests/integration/stage against the Hub emulator.)"""

from __future__ import annotations

import json

import pytest

from grpo_trainer import contract, stage, stage_markers
from grpo_trainer.exitcodes import TrainerError
from tests.support.trainer import TINY_DATA, TINY_MODEL


def doc(model="org/tiny", dataset="org/data", training=None, rewards=None, **ds):
    return {"model": model, "dataset": {"name": dataset, **ds}, "rewards": rewards or [{"name": "accuracy"}],
            "training": training or {}}


def test_plan_reads_revision_trust_config_split_and_reward_models():
    items = stage.plan(doc(training={"model_init_kwargs": {"revision": "v1"}, "trust_remote_code": True},
                           rewards=[{"name": "accuracy"}, {"model": "org/rm"}, {"model": "/pvc/rm"}],
                           config="main", split="test"))
    assert [(i.kind, i.repo_id, i.revision, i.trust_remote_code) for i in items] == [
        ("model", "org/tiny", "v1", True), ("model", "org/rm", "main", True), ("dataset", "org/data", "main", False)]
    assert (items[2].config, items[2].split) == ("main", "test")
    assert len({i.key for i in items}) == 3


def test_local_paths_are_not_staged():
    assert stage.plan(doc(model=str(TINY_MODEL), dataset=str(TINY_DATA))) == []
    assert stage.plan(doc(model="/models/missing", dataset="./data.jsonl")) == []
    assert stage.plan(doc(model="examples/missing/model", dataset="a/b/c.jsonl")) == []


def test_plan_refuses_a_config_without_model():
    with pytest.raises(TrainerError) as e:
        stage.plan({"dataset": {}})
    assert e.value.code == contract.CONFIG


@pytest.mark.parametrize("files, trust, wanted, unwanted", [
    (["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "chat_template.jinja", "x.py",
      "README.md", "onnx/model.onnx"], False,
     ["config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"],
     ["pytorch_model.bin", "x.py", "README.md", "onnx/model.onnx"]),
    (["config.json", "pytorch_model.bin", "tokenizer.model", "modeling_x.py"], True,
     ["config.json", "pytorch_model.bin", "tokenizer.model", "modeling_x.py"], []),
    (["model-00001-of-00002.safetensors", "model.safetensors.index.json", "merges.txt", "vocab.json"], False,
     ["model-00001-of-00002.safetensors", "model.safetensors.index.json", "merges.txt", "vocab.json"], []),
])
def test_model_patterns(files, trust, wanted, unwanted):
    chosen = stage.selected(dict.fromkeys(files, 1), stage.model_patterns(files, trust))
    assert sorted(chosen) == sorted(wanted) and not set(unwanted) & set(chosen)


def test_markers_require_their_paths(tmp_path):
    item = stage.Item("model", "org/tiny")
    assert not stage.already_staged(tmp_path, item)
    snap = tmp_path / "snap"
    snap.mkdir()
    stage._write_marker(tmp_path, item, {"paths": [str(snap)]})
    assert stage.already_staged(tmp_path, item)
    snap.rmdir()  # a pruned cache stages again
    assert not stage.already_staged(tmp_path, item)


def test_retries_back_off_then_give_up_retryable():
    sleeps: list[float] = []
    calls = []

    def flaky():
        calls.append(1)
        raise ConnectionError("reset")

    with pytest.raises(TrainerError) as e:
        stage.with_retries(flaky, stage.Item("model", "org/x"), attempts=4, backoff=2.0, sleep=sleeps.append)
    assert e.value.code == contract.TRANSIENT_IO and contract.is_retryable(e.value.code)
    assert sleeps == [2.0, 4.0, 8.0] and len(calls) == 4


def test_retries_stop_at_a_permanent_answer():
    import httpx
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    req = httpx.Request("GET", "http://hub/api/models/org/x")
    for exc, code in ((GatedRepoError("gated", response=httpx.Response(401, request=req)), contract.HUB_DENIED),
                      (RepositoryNotFoundError("nope", response=httpx.Response(404, request=req)),
                       contract.HUB_NOT_FOUND)):
        sleeps: list[float] = []

        def fail(exc=exc):
            raise exc

        with pytest.raises(TrainerError) as e:
            stage.with_retries(fail, stage.Item("model", "org/x"), attempts=5, backoff=1.0, sleep=sleeps.append)
        assert e.value.code == code and sleeps == []


def test_meter_counts_partial_bytes_and_complete_files(tmp_path):
    """Bytes from the blobs folder (a partial download counts), files from the snapshot's links (complete ones)."""
    folder, sha = tmp_path / "models--org--tiny", "a" * 40
    files = {"config.json": 10, "model.safetensors": 1000}
    meter = stage._Meter(stage.Item("model", "org/tiny"), folder, files, sha)
    assert meter.record() == {"item": "model org/tiny@main", "bytes": 0, "totalBytes": 1010, "files": 0,
                              "totalFiles": 2}
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / "c0ffee").write_bytes(b"x" * 10)
    (folder / "blobs" / "beef.incomplete").write_bytes(b"x" * 300)
    (folder / "snapshots" / sha).mkdir(parents=True)
    (folder / "snapshots" / sha / "config.json").symlink_to(folder / "blobs" / "c0ffee")
    assert meter.record() | {"item": ""} == {"item": "", "bytes": 310, "totalBytes": 1010, "files": 1,
                                             "totalFiles": 2}
    assert meter.record(2)["files"] == 2


def test_progress_endpoint_answers_the_last_record():
    """GET /progress: the last GRPO_STAGE line, what the operator's scraper reads (lifecycle.staging.parse_record)."""
    import json
    import urllib.error
    import urllib.request

    from tests.support.cluster.util import free_port

    port = free_port()
    server = stage.serve_progress(port)
    assert server is not None
    try:
        lines: list[str] = []
        rec = {"event": "progress", "item": "model org/tiny@main", "bytes": 5, "totalBytes": 9, "files": 1,
               "totalFiles": 6}
        stage.emit(rec, out=lines.append)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{contract.STAGE_PROGRESS_PATH}", timeout=5) as resp:
            body = resp.read().decode()
        assert body == lines[0] + "\n" and json.loads(body[len(contract.STAGE_PREFIX):]) == rec
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert e.value.code == 404
        # a port that cannot be bound only loses the live progress: a warning, no exception
        assert stage.serve_progress(port) is None
    finally:
        server.shutdown()
        server.server_close()


def test_plan_stages_the_eval_split_too():
    """spec.dataset.evalSplit (and evalName) are read offline by the trainer: the download pod stages them."""
    from grpo_trainer import stage as stage_mod

    doc = {"model": "/models/m", "rewards": [], "dataset": {"name": "openai/gsm8k", "config": "main", "split": "train",
                                                           "evalSplit": "test"}}
    got = [(i.repo_id, i.config, i.split) for i in stage_mod.plan(doc) if i.kind == "dataset"]
    assert got == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    doc["dataset"]["evalName"] = "org/held-out"
    got = [(i.repo_id, i.config, i.split) for i in stage_mod.plan(doc) if i.kind == "dataset"]
    assert got[1] == ("org/held-out", None, "test")
    doc["dataset"]["evalName"] = "/data/held-out.jsonl"
    assert len([i for i in stage_mod.plan(doc) if i.kind == "dataset"]) == 1


def test_marker_writes_of_two_pods_never_collide(tmp_path, monkeypatch):
    """Issue 27, item 9: two download pods collided on the marker's temporary file (`.tmp{pid}` is `.tmp1` in every
    pod: python is PID 1): the second rename found no file and its FileNotFoundError failed the job. Here the other
    pod writes the same marker between this one's write and rename, both as PID 1: both succeed."""
    monkeypatch.setattr(stage.os, "getpid", lambda: 1)
    item = stage.Item("model", "org/tiny")
    real_replace = stage.os.replace
    other_done = []

    def replace(src, dst):  # the other pod's whole write happens while this one is between write and rename
        if not other_done:
            other_done.append(True)
            stage._write_marker(tmp_path, item, {"paths": [str(tmp_path)], "by": "other"})
        real_replace(src, dst)

    monkeypatch.setattr(stage.os, "replace", replace)
    stage._write_marker(tmp_path, item, {"paths": [str(tmp_path)], "by": "this"})
    assert other_done and stage.already_staged(tmp_path, item)
    assert [p.name for p in (tmp_path / stage_markers.MARKER_DIR).iterdir()] == [f"{item.key}.json"]  # no temp file left


def _fake_hub(monkeypatch, commits: dict[str, str], calls: list[str]):
    """stage.resolve and the downloads without a Hub: `commits` is what each revision names now."""
    def resolve(item):
        calls.append(f"resolve {item.revision}")
        return commits[item.revision]

    def download(item, hf_home, sha):
        calls.append(f"download {sha[:1]}")
        snap = hf_home / sha
        snap.mkdir(parents=True, exist_ok=True)
        return {"commit": sha, "paths": [str(snap)], "bytes": 1, "totalBytes": 1, "files": 1, "totalFiles": 1}

    monkeypatch.setattr(stage, "resolve", resolve)
    monkeypatch.setattr(stage, "stage_model", download)
    monkeypatch.setattr(stage, "emit", lambda record, out=None: None)


def test_a_marker_that_cannot_be_written_is_retried_never_permanent(tmp_path, monkeypatch):
    """Issue 27, item 9: an error writing a marker (the collision's FileNotFoundError) escaped the retries and exited 1,
    a permanent failure. It is retried like any transient failure."""
    calls: list[str] = []
    _fake_hub(monkeypatch, {"main": "a" * 40}, calls)
    real_write, failures = stage._write_marker, [FileNotFoundError(2, "No such file or directory", ".tmp1")]

    def write(*args, **kw):
        if failures:
            raise failures.pop()
        real_write(*args, **kw)

    monkeypatch.setattr(stage, "_write_marker", write)
    done = stage.stage_all([stage.Item("model", "org/tiny")], tmp_path, attempts=3, backoff=0)
    assert done["staged"] == ["model org/tiny@main"] and done["revisions"][0]["commit"] == "a" * 40


def test_a_revision_is_resolved_once_downloaded_by_commit_and_reused(tmp_path, monkeypatch):
    """Issue 27, item 8: markers were per requested revision while the download followed refs/main. Now: main is
    resolved to a commit, that commit is downloaded and marked; a later run reuses it without the Hub even after main
    moved; another revision naming a commit already staged downloads nothing."""
    calls: list[str] = []
    commits = {"main": "a" * 40, "v1": "b" * 40}
    _fake_hub(monkeypatch, commits, calls)
    main, v1 = stage.Item("model", "org/tiny"), stage.Item("model", "org/tiny", "v1")
    first = stage.stage_all([main], tmp_path)
    assert calls == ["resolve main", "download a"]
    assert first["revisions"] == [{"kind": "model", "repo": "org/tiny", "revision": "main", "commit": "a" * 40}]
    calls.clear()
    commits["main"] = "b" * 40  # main moves: the cache keeps what this revision was staged at, no request
    again = stage.stage_all([main], tmp_path)
    assert calls == [] and again["cached"] == ["model org/tiny@main"] and again["revisions"] == first["revisions"]
    later = stage.stage_all([v1], tmp_path)
    assert calls == ["resolve v1", "download b"] and later["revisions"][0]["commit"] == "b" * 40
    calls.clear()
    pinned = stage.stage_all([stage.Item("model", "org/tiny", "b" * 40)], tmp_path)  # a commit is its own
    assert calls == [] and pinned["cached"] and pinned["revisions"][0]["commit"] == "b" * 40


def test_the_termination_message_keeps_the_commits_within_the_kubelets_limit():
    revisions = [{"kind": "model", "repo": f"org/m{i}", "revision": "main", "commit": "a" * 40} for i in range(3)]
    summary = {"event": "done", "staged": ["model " + "x" * 1500] * 4, "cached": [], "revisions": revisions,
               "bytes": 1, "seconds": 1.0}
    line = stage.termination_line(summary)
    assert len(line.encode()) < stage.TERMINATION_BYTES
    assert json.loads(line[len(contract.STAGE_PREFIX):])["revisions"] == revisions


def test_pins_parse_only_well_formed_commits():
    from grpo_trainer import pins

    good = {"kind": "model", "repo": "org/tiny", "commit": "a" * 40}
    text = json.dumps([good, {"kind": "model", "repo": "org/x", "commit": "main"}, {"repo": "org/y"}, "junk",
                       {"kind": "dataset", "repo": "org/data", "commit": "c" * 40}])
    p = pins.parse(text)
    assert p == {("model", "org/tiny"): "a" * 40, ("dataset", "org/data"): "c" * 40}
    assert pins.model_revision(p, "org/tiny", "main") == "a" * 40 and pins.model_revision(p, "org/x", "v1") == "v1"
    assert pins.parse("not json") == {} and pins.parse(None) == {} and pins.from_env({}) == {}
    assert pins.dataset_cache_dir(p, "org/other") is None
    assert pins.dataset_cache_dir(p, "org/data").endswith(f"{contract.DATASET_COMMITS_DIR}/{'c' * 40}")
