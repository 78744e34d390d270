"""A local Hugging Face Hub for tests: the download protocol huggingface_hub and datasets speak
(the endpoints huggingface_hub's snapshot_download and datasets call), served from memory on loopback.

    hub = HubEmulator()
    hub.add_model("org/tiny", TINY_MODEL)            # a folder becomes one commit; returns its 40-hex sha
    hub.add_dataset("org/data", {"data/train.jsonl": b"..."})
    with hub:                                         # starts on 127.0.0.1:<free port>, stops on exit
                                                      # (HubEmulator(host=IP): an address pods can reach)
        env = {"HF_ENDPOINT": hub.url, ...}
        ...
        hub.requests(method="GET", path_contains="resolve")   # the access log

Faults, injected per request path: `hub.fail(substring, status, times)` answers an HTTP error (401 gated, 404, 500…),
`hub.cut(substring, after_bytes, times)` sends the headers of a whole file, then `after_bytes` of its body, and
closes the connection (a mid-file network failure). `hub.throttle(substring, bytes_per_second)` serves matching
file bodies slowly (a download that takes a while). `hold = hub.hold(substring)` keeps matching file downloads
waiting until `hold.release()` (`hold.arrived` is set by the first: a download caught in the middle, as long as the
test needs). `hub.require_token(repo, token)` makes a repo gated: requests
without `Authorization: Bearer <token>` get 401 GatedRepo.

What it answers (huggingface_hub 1.33, datasets 5.2): model/dataset info and revision info, the tree API (recursive,
paths inside the repo), HEAD/GET resolve with X-Repo-Commit, ETag (git blob sha1; sha256 for LFS-like files),
Content-Length and Range (206), 404 with X-Error-Code, whoami-v2. Anything else: 404 and an entry in the log.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".parquet", ".arrow", ".gguf")


@dataclass
class Request:
    method: str
    path: str
    status: int
    range: str | None = None
    sent: int = 0  # body bytes written
    authorization: str | None = None


@dataclass
class Fault:
    substring: str
    status: int = 0  # an HTTP status, or 0 for a connection cut
    after_bytes: int = 0
    times: int = 1
    error_code: str | None = None


@dataclass
class Hold:
    substring: str
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    timeout: float = 120.0  # a test that never releases fails its download instead of hanging

    def release(self) -> None:
        self.released.set()


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]


@dataclass
class Repo:
    kind: str  # "model" or "dataset"
    repo_id: str
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag → sha
    token: str | None = None


def _oid(path: str, data: bytes) -> tuple[str, bool]:
    if path.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest(), True
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), False


def read_folder(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class HubEmulator:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.repos: dict[tuple[str, str], Repo] = {}
        self.log: list[Request] = []
        self.faults: list[Fault] = []
        self.throttles: list[tuple[str, int]] = []  # (path substring, bytes per second)
        self.holds: list[Hold] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------ repos
    def _add(self, kind: str, repo_id: str, files: dict[str, bytes] | Path, ref: str) -> str:
        content = read_folder(files) if isinstance(files, Path) else dict(files)
        repo = self.repos.setdefault((kind, repo_id), Repo(kind, repo_id))
        sha = hashlib.sha1(json.dumps([repo_id, ref, len(repo.commits),
                                       sorted((k, hashlib.sha1(v).hexdigest()) for k, v in content.items())]
                                      ).encode()).hexdigest()
        repo.commits[sha] = Commit(sha, content)
        repo.refs[ref] = sha
        return sha

    def add_model(self, repo_id: str, files: dict[str, bytes] | Path, ref: str = "main") -> str:
        """A commit of a model repo; `ref` (a branch or tag) then points at it. Returns the commit sha."""
        return self._add("model", repo_id, files, ref)

    def add_dataset(self, repo_id: str, files: dict[str, bytes] | Path, ref: str = "main") -> str:
        return self._add("dataset", repo_id, files, ref)

    def require_token(self, repo_id: str, token: str) -> None:
        for (_, rid), repo in self.repos.items():
            if rid == repo_id:
                repo.token = token

    def fail(self, substring: str, status: int, times: int = 1, error_code: str | None = None) -> None:
        self.faults.append(Fault(substring, status=status, times=times, error_code=error_code))

    def cut(self, substring: str, after_bytes: int, times: int = 1) -> None:
        self.faults.append(Fault(substring, status=0, after_bytes=after_bytes, times=times))

    def throttle(self, substring: str, bytes_per_second: int) -> None:
        self.throttles.append((substring, bytes_per_second))

    def hold(self, substring: str) -> Hold:
        hold = Hold(substring)
        self.holds.append(hold)
        return hold

    # ------------------------------------------------------------------------------------------ log
    def requests(self, method: str | None = None, path_contains: str = "") -> list[Request]:
        with self._lock:
            return [r for r in self.log if (method is None or r.method == method) and path_contains in r.path]

    def clear_log(self) -> None:
        with self._lock:
            self.log.clear()

    # ------------------------------------------------------------------------------------------ server
    @property
    def url(self) -> str:
        assert self._server is not None, "start() the emulator first"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> HubEmulator:
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer((self.host, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> HubEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.times > 0 and f.substring in path and (f.status or method == "GET"):  # cuts: bodies only
                    f.times -= 1
                    return f
        return None


_API = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(?:/(.*))?)?$")
_RESOLVE = re.compile(r"^/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    hub: HubEmulator
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass  # the access log is hub.log

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._answer(404, {"X-Error-Code": "EntryNotFound"}, b"{}", body=True)

    # ------------------------------------------------------------------------------------------
    def _record(self, status: int, sent: int = 0) -> None:
        with self.hub._lock:
            self.hub.log.append(Request(self.command, self.path, status, self.headers.get("Range"), sent,
                                        self.headers.get("Authorization")))

    def _answer(self, status: int, headers: dict[str, str], data: bytes, body: bool, rate: int = 0) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/json", **headers, "Content-Length": str(len(data))}
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if body and rate:  # a slow link: pieces of a tenth of a second's worth
            piece = max(rate // 10, 1)
            for i in range(0, len(data), piece):
                if i:
                    time.sleep(0.1)
                self.wfile.write(data[i:i + piece])
                self.wfile.flush()
        elif body:
            self.wfile.write(data)
        self._record(status, len(data) if body else 0)

    def _error(self, status: int, code: str | None, body: bool, extra: dict[str, str] | None = None) -> None:
        headers = dict(extra or {})
        if code:
            headers["X-Error-Code"] = code
            headers["X-Error-Message"] = code
        self._answer(status, headers, json.dumps({"error": code or str(status)}).encode(), body)

    def _repo(self, kind: str, repo_id: str, rev: str, body: bool) -> tuple[Repo, Commit] | None:
        repo = self.hub.repos.get((kind, repo_id))
        if repo is None:
            self._error(404, "RepoNotFound", body)
            return None
        if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(401, "GatedRepo", body)
            return None
        sha = repo.refs.get(rev, rev if rev in repo.commits else None)
        if sha is None:
            self._error(404, "RevisionNotFound", body)
            return None
        return repo, repo.commits[sha]

    def _serve(self, body: bool) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parsed.path)
        fault = self.hub._take_fault(self.command, path)
        if fault is not None and fault.status:
            self._error(fault.status, fault.error_code, body)
            return
        if path == "/api/whoami-v2":
            self._answer(200, {}, json.dumps({"name": "tester", "type": "user"}).encode(), body)
            return
        m = _API.match(path)
        if m:
            self._api(m, urllib.parse.parse_qs(parsed.query), body)
            return
        m = _RESOLVE.match(path)
        if m:
            self._resolve("dataset" if m.group(1) else "model", m.group(2), m.group(3), m.group(4), body, fault)
            return
        self._error(404, "EntryNotFound", body)

    def _api(self, m: re.Match[str], query: dict[str, list[str]], body: bool) -> None:
        kind = m.group(1)[:-1]
        found = self._repo(kind, m.group(2), urllib.parse.unquote(m.group(4) or "main"), body)
        if found is None:
            return
        repo, commit = found
        if m.group(3) != "tree":
            info = {"id": repo.repo_id, "sha": commit.sha, "private": False, "gated": bool(repo.token),
                    "siblings": [{"rfilename": p} for p in sorted(commit.files)], "lastModified": "2026-01-01T00:00:00.000Z"}
            self._answer(200, {}, json.dumps(info).encode(), body)
            return
        prefix = (m.group(5) or "").strip("/")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        entries = self._tree(commit, prefix, recursive)
        self._answer(200, {}, json.dumps(entries).encode(), body)

    @staticmethod
    def _tree(commit: Commit, prefix: str, recursive: bool) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        dirs: set[str] = set()
        base = f"{prefix}/" if prefix else ""
        for path, data in sorted(commit.files.items()):
            if not path.startswith(base):
                continue
            rest = path[len(base):]
            parts = rest.split("/")
            for i in range(1, len(parts) if recursive else min(2, len(parts))):
                dirs.add(base + "/".join(parts[:i]))
            if len(parts) > 1 and not recursive:
                continue
            oid, lfs = _oid(path, data)
            entry: dict[str, object] = {"type": "file", "path": path, "size": len(data),
                                        "oid": hashlib.sha1(data).hexdigest() if lfs else oid}
            if lfs:
                entry["lfs"] = {"oid": oid, "size": len(data), "pointerSize": 130}
            out.append(entry)
        out += [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()} for d in sorted(dirs)]
        return out

    def _resolve(self, kind: str, repo_id: str, rev: str, file: str, body: bool, fault: Fault | None) -> None:
        found = self._repo(kind, repo_id, urllib.parse.unquote(rev), body)
        if found is None:
            return
        _, commit = found
        data = commit.files.get(file)
        if data is None:
            self._error(404, "EntryNotFound", body, {"X-Repo-Commit": commit.sha})
            return
        oid, _ = _oid(file, data)
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{oid}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        status, start = 200, 0
        rng = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
        if rng and body:
            start = int(rng.group(1))
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        chunk = data[start:]
        if fault is not None and not fault.status:  # a connection cut mid-file
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(chunk))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(chunk[:fault.after_bytes])
            self.wfile.flush()
            self.close_connection = True
            self._record(-1, min(fault.after_bytes, len(chunk)))
            return
        rate = next((r for sub, r in self.hub.throttles if sub in self.path), 0)
        for hold in (h for h in self.hub.holds if body and h.substring in self.path and not h.released.is_set()):
            hold.arrived.set()
            hold.released.wait(hold.timeout)
        self._answer(status, headers, chunk, body, rate)
