"""A stand-in for a vLLM server's OpenAI API on a loopback port, for the engine probe's tests: it answers
GET /v1/models and POST /v1/completions as `vllm serve` does (mode "ok"), answers 500 (mode "error"), or never
answers a completion (mode "hang": workers blocked in an unfinished weight sync while /health still answers), or
streams an endless body for /v1/models (mode "flood": a hostile image; `sent` counts the bytes it got out).
The mode can change while it runs; `requests` counts the completions asked for."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FLOOD_BYTES = 128 << 20  # past the bound the test asserts (64 MiB), small enough for a run before the fix


class FakeVllm:
    def __init__(self, mode: str = "ok", model: str = "tiny") -> None:
        self.mode, self.model, self.requests, self.sent = mode, model, 0, 0
        self._release = threading.Event()  # set on stop: hung requests end
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/v1/models" and fake.mode == "flood":
                    self._flood()
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def _flood(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                chunk = b'{"data": [' + b" " * 65536
                try:
                    while fake.sent < FLOOD_BYTES and not fake._release.is_set():
                        self.wfile.write(chunk)
                        fake.sent += len(chunk)
                except OSError:
                    pass  # the client hung up: what a bounded reader does

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/completions":
                    self._send(404, {"detail": "Not Found"})
                    return
                fake.requests += 1
                if fake.mode == "hang":
                    fake._release.wait(120)
                    return
                if fake.mode == "error":
                    self._send(500, {"error": "EngineCore encountered an issue"})
                    return
                ok = req.get("model") == fake.model and req.get("max_tokens") == 1
                self._send(200 if ok else 400, {"choices": [{"index": 0, "text": "!", "finish_reason": "length"}]}
                           if ok else {"error": f"unexpected request {req}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeVllm:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
