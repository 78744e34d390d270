"""The engine probe (I/O): a 1-token generation against a vLLM server kept across a trainer restart, run when
lifecycle.decide() asks for it (Decision.probe_server, lifecycle/server/keep.py) and handed back to the next pass
(JobView.engine_probe). /health only says the API server is up (vLLM's AsyncLLM.errored); a generation goes through
the engine's workers, which a trainer that died inside a weight sync leaves blocked in an NCCL receive.

The request is what TRL 1.16's VLLMClient sends: GET /v1/models for the served model's id, then POST /v1/completions
(max_tokens 1). A probe that fails, answers an error or does not answer within its deadline is a wedged server.
One probe per job at a time; its verdict is kept (for that server pod and attempt) until the job is forgotten."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Optional

import aiohttp

from ..lifecycle.server.order import EngineProbe, ProbeVerdict
from .workqueue import Key

log = logging.getLogger("grpo_operator")


# A tenant's image answers these requests: every body is read up to this many bytes, never more (a real answer to
# /v1/models or a 1-token completion is a few KiB), so an image that streams gigabytes cannot exhaust the operator.
MAX_BODY_BYTES = 64 * 1024


async def read_bounded(resp: aiohttp.ClientResponse, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, when it is at most `limit` bytes; ValueError (a wedged or hostile server) when longer."""
    raw = b""
    while len(raw) <= limit:  # read(n) returns what has arrived, at most n: loop until the end or past the bound
        chunk = await resp.content.read(limit + 1 - len(raw))
        if not chunk:
            break
        raw += chunk
    if len(raw) > limit:
        raise ValueError(f"answer longer than {limit} bytes")
    return raw


async def generate_one_token(base_url: str, timeout: float) -> tuple[bool, str]:
    """(the engine answered, what went wrong). Never raises for what the server does."""
    limit = aiohttp.ClientTimeout(total=timeout)
    try:
        async with aiohttp.ClientSession(trust_env=False, timeout=limit) as http:
            async with http.get(f"{base_url}/v1/models") as resp:
                if resp.status != 200:
                    return False, f"GET /v1/models answered {resp.status}"
                models: Any = json.loads(await read_bounded(resp))
            model = models["data"][0]["id"]
            payload = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
            async with http.post(f"{base_url}/v1/completions", json=payload) as resp:
                if resp.status != 200:
                    text = (await resp.content.read(200)).decode("utf-8", "replace")
                    return False, f"POST /v1/completions answered {resp.status}: {text}"
                body: Any = json.loads(await read_bounded(resp))
            if not body.get("choices"):
                return False, "POST /v1/completions answered without choices"
            return True, ""
    except TimeoutError:
        return False, f"no answer within {timeout:g}s"
    except (aiohttp.ClientError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return False, f"{type(exc).__name__}: {exc}"[:300]


class EngineProbes:
    """Probes in flight and their verdicts, per job; `kick` re-runs the job's reconcile when one is known."""

    def __init__(self, kick: Callable[[Key], None]):
        self._kick = kick
        self._verdicts: dict[Key, ProbeVerdict] = {}
        self._tasks: dict[Key, tuple[tuple[str, int], asyncio.Task[None]]] = {}

    def verdict(self, key: Key) -> Optional[ProbeVerdict]:
        return self._verdicts.get(key)

    def request(self, key: Key, probe: Optional[EngineProbe]) -> None:
        """Start the probe unless its verdict is known or it already runs (decide() asks on every pass; None: no
        probe asked for)."""
        if probe is None:
            return
        target = (probe.uid, probe.attempt)
        known = self._verdicts.get(key)
        if known is not None and (known.uid, known.attempt) == target:
            return
        running = self._tasks.get(key)
        if running is not None and not running[1].done():
            if running[0] == target:
                return
            running[1].cancel()
        self._tasks[key] = (target, asyncio.get_running_loop().create_task(self._run(key, probe)))

    async def _run(self, key: Key, probe: EngineProbe) -> None:
        ok, detail = await generate_one_token(probe.url, probe.timeout)
        log.info("%s/%s: engine probe of the kept vLLM server %s: %s", key[0], key[1], probe.pod,
                 "answered" if ok else detail)
        self._verdicts[key] = ProbeVerdict(probe.uid, probe.attempt, ok, detail)
        self._tasks.pop(key, None)
        self._kick(key)

    def forget(self, key: Key) -> None:
        self._verdicts.pop(key, None)
        running = self._tasks.pop(key, None)
        if running is not None:
            running[1].cancel()

    async def close(self) -> None:
        tasks = [t for _, t in self._tasks.values()]
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
