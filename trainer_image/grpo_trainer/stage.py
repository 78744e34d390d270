"""`python -m grpo_trainer.stage --config FILE [--cache-dir DIR]`: stage what a job loads from the Hub into HF_HOME,
once, so that the trainers and vLLM load it offline (spec.cache, docs/cache.md).

It reads the trainer's own config JSON and stages:
- the model at its revision (training.model_init_kwargs.revision, default main), only the files loading needs:
  config/tokenizer/generation files, the weights (safetensors when the repo has them, else .bin), chat templates,
  and *.py only with training.trust_remote_code;
- each reward model (rewards[].model), the same way;
- the dataset at its config and split, with `datasets.load_dataset` itself: an offline `load_dataset(<hub id>)` reads
  only the datasets (Arrow) cache, never the Hub snapshot, so the trainer's own call must find it there.
Model/dataset references that are paths (they exist, or start with / ./ ../ ~) are skipped: nothing to download.

Each revision is resolved to a commit once, that commit is downloaded (never through refs/<revision>, which another
job staging the same repo may move before its own download is complete) and marked: a marker per staged commit
($HF_HOME/grpo-stage/<key>.json, naming the files) and one per requested revision naming the commit it was staged at,
so a second run exits 0 at once, with no request to the Hub. The done record lists the commit of every item
(`revisions`): the operator records them in the job's status and the trainers and vLLM load exactly those
(contract.STAGED_REVISIONS_ENV). Several download pods may stage into one cache at once: markers are written under
unique temporary names and renamed into place, and anything unexpected while staging is retried, never permanent.

Progress: `GRPO_STAGE {json}` lines on stdout (contract.STAGE_PREFIX) with bytes and files done/total; with
--progress-port, `GET /progress` on that port answers the last of them (the operator scrapes it into the job's
Staged condition while the pod downloads, as it scrapes the trainers' /metrics).
Exit codes (contract.py): 0 staged; 18 the Hub refused access (401 gated, 403); 19 no such repo/revision/file (404);
202 the Hub failed (5xx, timeout, cut connection) after retries with backoff.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import pins
from .contract import STAGE_PREFIX, STAGE_PROGRESS_PATH
from .exitcodes import CONFIG, HUB_DENIED, HUB_NOT_FOUND, TRANSIENT_IO, TrainerError, write_termination_message
from .stage_markers import Item, _read_marker, _write_marker, already_staged, at_commit, known_commit

# What loading a causal LM/tokenizer reads (transformers 5): configs, tokenizers, chat templates, weights.
BASE_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*")
SAFETENSORS = ("*.safetensors",)
PYTORCH_BIN = ("*.bin",)
CODE = ("*.py",)


def is_local(ref: str) -> bool:
    """A path inside the pod (or on this machine), not a Hub id: the trainer's own rule (data.py), and, as the
    operator's render/cache.py reads it, more than one '/' (a Hub id is at most namespace/name)."""
    return ref.startswith(("/", "./", "../", "~")) or ref.count("/") > 1 or os.path.exists(ref)


def plan(doc: dict[str, Any]) -> list[Item]:
    """What the job loads from the Hub, from the trainer config JSON (docs/trainer-config.md)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), str) or not isinstance(doc.get("dataset"), dict):
        raise TrainerError(CONFIG, "the trainer config needs 'model' (a string) and 'dataset' (an object)")
    training: dict[str, Any] = doc["training"] if isinstance(doc.get("training"), dict) else {}
    init: dict[str, Any] = training["model_init_kwargs"] if isinstance(training.get("model_init_kwargs"), dict) else {}
    revision = str(init.get("revision") or "main")
    trust = bool(training.get("trust_remote_code") or init.get("trust_remote_code"))
    items: list[Item] = []
    if not is_local(doc["model"]):
        items.append(Item("model", doc["model"], revision, trust))
    for reward in doc.get("rewards") or []:
        ref = reward.get("model") if isinstance(reward, dict) else None
        if isinstance(ref, str) and not is_local(ref) and all(i.repo_id != ref for i in items):
            items.append(Item("model", ref, "main", trust))
    ds = doc["dataset"]
    name = ds.get("name")
    if not isinstance(name, str):
        raise TrainerError(CONFIG, "'dataset.name' must be a string in the trainer config")
    if not is_local(name):
        items.append(Item("dataset", name, "main", False, ds.get("config"), ds.get("split") or "train"))
    eval_name, eval_split = ds.get("evalName") or name, ds.get("evalSplit")
    if isinstance(eval_split, str) and isinstance(eval_name, str) and not is_local(eval_name):
        # the eval split (spec.dataset.evalSplit), read offline by the trainer like the train split
        items.append(Item("dataset", eval_name, "main", False, ds.get("config") if eval_name == name else None,
                          eval_split))
    return items


def model_patterns(files: list[str], trust_remote_code: bool) -> list[str]:
    """allow_patterns for a model repo: safetensors weights when there are any (else .bin), code only if trusted."""
    patterns = list(BASE_PATTERNS)
    has_safetensors = any(fnmatch.fnmatch(f, SAFETENSORS[0]) for f in files)
    patterns += SAFETENSORS if has_safetensors else PYTORCH_BIN
    if trust_remote_code:
        patterns += CODE
    return patterns


def selected(files: dict[str, int], patterns: list[str]) -> dict[str, int]:
    return {f: s for f, s in files.items() if any(fnmatch.fnmatch(f, p) for p in patterns)}


# --------------------------------------------------------------------------------------------------- output
class _Latest:
    line = ""  # the last GRPO_STAGE line: what GET /progress answers (one str assignment: no lock needed)


def emit(record: dict[str, Any], out: Callable[[str], None] | None = None) -> None:
    line = STAGE_PREFIX + json.dumps(record, sort_keys=True)
    _Latest.line = line
    (out or _print)(line)


class _ProgressHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path.split("?", 1)[0] == STAGE_PROGRESS_PATH
        body = (_Latest.line + "\n").encode() if found else b"not found\n"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # stdout is for GRPO_STAGE lines


def serve_progress(port: int) -> ThreadingHTTPServer | None:
    """Serve GET /progress on `port`, all interfaces (the pod IP), in a daemon thread of this process. A port that
    cannot be bound is a warning: staging goes on without the live progress (the log lines stay)."""
    last: OSError | None = None
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):  # "::" takes IPv4 too (dual stack)
        server_class = type("_Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        try:
            server = server_class((addr, port), _ProgressHandler)
        except OSError as e:  # no IPv6 in this network namespace, or the port is taken
            last = e
            continue
        threading.Thread(target=server.serve_forever, name="stage-progress", daemon=True).start()
        return server
    sys.stderr.write(f"grpo_trainer.stage: warning: cannot serve progress on port {port} ({last})\n")
    return None


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _Meter:
    """Prints bytes and files done/total every `interval` s while a download runs: bytes from the blobs folder's size
    (partial files included), files from the snapshot's links (made once a file is complete)."""

    def __init__(self, item: Item, folder: Path, files: dict[str, int], commit: str | None, interval: float = 2.0):
        self.item, self.folder, self.files, self.commit = item, folder, files, commit
        self.total_bytes, self.total_files = sum(files.values()), len(files)
        self.interval = interval
        self.start_bytes = self._size()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        blobs = self.folder / "blobs"
        return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file()) if blobs.is_dir() else 0

    def _files_done(self) -> int:
        snapshot = self.folder / "snapshots" / (self.commit or "-")
        return sum(1 for f in self.files if (snapshot / f).exists()) if snapshot.is_dir() else 0

    def record(self, files_done: int | None = None) -> dict[str, Any]:
        done = min(self._size(), self.total_bytes) if self.total_bytes else self._size()
        return {"item": self.item.label, "bytes": done, "totalBytes": self.total_bytes,
                "files": self._files_done() if files_done is None else files_done, "totalFiles": self.total_files}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            emit({"event": "progress", **self.record()})

    def __enter__(self) -> _Meter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------------------------------- staging
def resolve(item: Item) -> str:
    """The commit `item.revision` names now (one request to the Hub; a commit is its own)."""
    if pins.is_commit(item.revision):
        return item.revision
    from huggingface_hub import HfApi

    api = HfApi()
    info = api.model_info(item.repo_id, revision=item.revision) if item.kind == "model" \
        else api.dataset_info(item.repo_id, revision=item.revision)
    if not pins.is_commit(info.sha):
        raise RuntimeError(f"the Hub named no commit for {item.label} (got {info.sha!r})")
    return str(info.sha)


def stage_model(item: Item, hf_home: Path, sha: str) -> dict[str, Any]:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    tree = {f.path: int(f.size or 0) for f in api.list_repo_tree(item.repo_id, revision=sha, recursive=True)
            if isinstance(f, RepoFile)}
    patterns = model_patterns(list(tree), item.trust_remote_code)
    files = selected(tree, patterns)
    folder = hf_home / "hub" / f"models--{item.repo_id.replace('/', '--')}"
    emit({"event": "start", "item": item.label, "commit": sha, "bytes": 0, "totalBytes": sum(files.values()),
          "files": 0, "totalFiles": len(files)})
    with _Meter(item, folder, files, sha) as meter:
        # by commit: snapshots/<sha> only, no refs/<revision> written (the pods load the commit itself)
        path = snapshot_download(item.repo_id, revision=sha, allow_patterns=sorted(files))
        rec = meter.record(len(files))
    return {"commit": sha, "paths": [path], "files": sorted(files), **rec}


def stage_dataset(item: Item, hf_home: Path, sha: str) -> dict[str, Any]:
    import datasets
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    files = {f.path: int(f.size or 0) for f in HfApi().list_repo_tree(
        item.repo_id, repo_type="dataset", revision=sha, recursive=True) if isinstance(f, RepoFile)}
    emit({"event": "start", "item": item.label, "commit": sha, "bytes": 0, "totalBytes": sum(files.values()),
          "files": 0, "totalFiles": len(files)})
    with _Meter(item, hf_home / "hub" / f"datasets--{item.repo_id.replace('/', '--')}", files, sha):
        # the trainer's very call (data.py), at the commit, into that commit's own datasets cache (pins.py)
        ds = datasets.load_dataset(item.repo_id, item.config, split=item.split, revision=sha,
                                   cache_dir=pins.commit_cache_dir(sha))
    paths = sorted({os.path.dirname(f["filename"]) for f in ds.cache_files}) or [pins.commit_cache_dir(sha)]
    return {"commit": sha, "paths": paths, "rows": len(ds), "bytes": sum(files.values()),
            "totalBytes": sum(files.values()), "files": len(files), "totalFiles": len(files)}


def stage_one(item: Item, hf_home: Path) -> dict[str, Any]:
    """Resolve, download by commit (unless another job already staged that commit), mark; the record (with
    `cached: True` when nothing was downloaded)."""
    sha = resolve(item)
    pinned = at_commit(item, sha)
    if already_staged(hf_home, pinned):
        rec: dict[str, Any] = {"commit": sha, "cached": True, **_read_marker(hf_home, pinned)}
    else:
        rec = (stage_model if item.kind == "model" else stage_dataset)(item, hf_home, sha)
        _write_marker(hf_home, pinned, rec)
    if pinned != item:  # the revision → its commit, for the next job that asks for it
        _write_marker(hf_home, item, {"commit": sha, "paths": rec.get("paths") or []})
    return rec


# --------------------------------------------------------------------------------------------------- errors
def classify(exc: BaseException, item: Item) -> TrainerError | None:
    """Permanent Hub answers (401/403 → 18, 404 → 19); None for what is worth retrying (5xx, timeouts, cuts)."""
    from huggingface_hub import errors as hf

    what = f"{item.label}"
    if isinstance(exc, hf.GatedRepoError):
        return TrainerError(HUB_DENIED, f"{what}: the repo is gated and the token has no access (401); accept its "
                                        "terms on the Hub and set spec.hfTokenSecretRef to a token that has")
    if isinstance(exc, (hf.RepositoryNotFoundError, hf.RevisionNotFoundError, hf.RemoteEntryNotFoundError)):
        kind = "revision" if isinstance(exc, hf.RevisionNotFoundError) else "repo"
        return TrainerError(HUB_NOT_FOUND, f"{what}: no such {kind} on the Hub (404); check the spelling, or give "
                                           "spec.hfTokenSecretRef for a private repo")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return TrainerError(HUB_DENIED, f"{what}: the Hub refused the token ({status}); check spec.hfTokenSecretRef")
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return TrainerError(HUB_NOT_FOUND if status == 404 else CONFIG, f"{what}: the Hub answered {status}: "
                                                                         f"{_first(exc)}")
    ds_not_found = _datasets_not_found(exc)
    if ds_not_found:
        return TrainerError(HUB_NOT_FOUND, f"{what}: {ds_not_found}")
    return None


def _datasets_not_found(exc: BaseException) -> str | None:
    try:
        from datasets.exceptions import DatasetNotFoundError
    except ImportError:  # pragma: no cover - datasets is always there in the image
        return None
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, DatasetNotFoundError):
            return _first(cause)
        cause = cause.__cause__ or cause.__context__
    return None


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def with_retries(fn: Callable[[], dict[str, Any]], item: Item, *, attempts: int, backoff: float,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Run fn; retry transient failures with exponential backoff (backoff, 2×, 4× … capped at 60 s)."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except TrainerError:
            raise
        except Exception as e:
            known = classify(e, item)
            if known is not None:
                raise known from None
            if attempt == attempts:
                raise TrainerError(TRANSIENT_IO, f"{item.label}: the Hub failed {attempts} times, last: "
                                                 f"{type(e).__name__}: {_first(e)}") from None
            delay = min(60.0, backoff * 2 ** (attempt - 1))
            emit({"event": "retry", "item": item.label, "attempt": attempt, "delaySeconds": delay,
                  "error": f"{type(e).__name__}: {_first(e)}"[:300]})
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def stage_all(items: list[Item], hf_home: Path, *, attempts: int = 5, backoff: float = 2.0) -> dict[str, Any]:
    """Stage every item not already there; the summary record (what GRPO_STAGE {"event": "done"} prints), with the
    commit of every item in `revisions` (what the job's pods load)."""
    started = time.monotonic()
    staged, cached, revisions, total_bytes = [], [], [], 0
    for item in items:
        commit = known_commit(hf_home, item)
        if commit is not None and already_staged(hf_home, at_commit(item, commit)):
            rec: dict[str, Any] = {"commit": commit, "cached": True}
        else:
            rec = with_retries(functools.partial(stage_one, item, hf_home), item, attempts=attempts,
                               backoff=backoff)
        revisions.append({"kind": item.kind, "repo": item.repo_id, "revision": item.revision,
                          "commit": rec["commit"]})
        if rec.get("cached"):
            cached.append(item.label)
            emit({"event": "cached", "item": item.label, "commit": rec["commit"]})
            continue
        total_bytes += int(rec.get("bytes") or 0)
        staged.append(item.label)
        emit({"event": "staged", "item": item.label, "commit": rec.get("commit"), "bytes": rec.get("bytes"),
              "totalBytes": rec.get("totalBytes"), "files": rec.get("files"), "totalFiles": rec.get("totalFiles")})
    return {"event": "done", "staged": staged, "cached": cached, "revisions": revisions, "bytes": total_bytes,
            "seconds": round(time.monotonic() - started, 3)}


# the kubelet keeps the first 4096 bytes of a termination message: the operator reads the commits from it
TERMINATION_BYTES = 4096


def termination_line(summary: dict[str, Any]) -> str:
    """The done record for the termination message, within the kubelet's limit: the lists of labels give way to
    their counts before the commits do."""
    line = STAGE_PREFIX + json.dumps(summary, sort_keys=True)
    if len(line.encode()) < TERMINATION_BYTES:
        return line
    short = {**summary, "staged": [f"{len(summary['staged'])} items"] if summary["staged"] else [],
             "cached": [f"{len(summary['cached'])} items"] if summary["cached"] else []}
    return STAGE_PREFIX + json.dumps(short, sort_keys=True)


# --------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_trainer.stage", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the trainer config JSON (docs/trainer-config.md)")
    parser.add_argument("--cache-dir", help="HF_HOME to stage into (default: $HF_HOME)")
    parser.add_argument("--progress-port", type=int, default=0,
                        help=f"serve GET {STAGE_PROGRESS_PATH} (the last GRPO_STAGE line) on this port; 0: off")
    ns = parser.parse_args(argv)
    if ns.progress_port:
        serve_progress(ns.progress_port)
    if ns.cache_dir:
        os.environ["HF_HOME"] = os.path.abspath(ns.cache_dir)  # before huggingface_hub is imported: read once
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.pop(key, None)  # staging is the one step that reaches the Hub
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # the GRPO_STAGE lines are the progress
    hf_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    try:
        try:
            with open(ns.config, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise TrainerError(CONFIG, f"cannot read the config file {ns.config}: {e}") from None
        summary = stage_all(plan(doc), hf_home, attempts=int(os.environ.get("GRPO_STAGE_ATTEMPTS", "5")),
                            backoff=float(os.environ.get("GRPO_STAGE_BACKOFF_SECONDS", "2")))
    except TrainerError as e:
        line = e.line().replace("grpo_trainer:", "grpo_trainer.stage:", 1)
        sys.stderr.write(line + "\n")
        write_termination_message(line)
        return e.code
    emit(summary)
    write_termination_message(termination_line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
