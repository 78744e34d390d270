"""The engine probe (controller/engine_probe.py) against a local stand-in of vLLM's OpenAI API: a server that
answers passes; one that answers 500, hangs past the deadline or is not there fails, with the reason; EngineProbes
runs one probe per (server pod, attempt), keeps its verdict and kicks the job."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from grpo_operator.controller.engine_probe import EngineProbes, generate_one_token
from grpo_operator.lifecycle.server.order import EngineProbe
from tests.support.fake_vllm import FakeVllm


@pytest.mark.asyncio
async def test_an_answering_engine_passes() -> None:
    with FakeVllm("ok") as fake:
        assert await generate_one_token(fake.url, 5.0) == (True, "")
        assert fake.requests == 1


@pytest.mark.asyncio
async def test_an_engine_error_fails() -> None:
    with FakeVllm("error") as fake:
        ok, detail = await generate_one_token(fake.url, 5.0)
    assert not ok and "500" in detail and "EngineCore" in detail


@pytest.mark.asyncio
async def test_a_hung_engine_fails_at_the_deadline() -> None:
    with FakeVllm("hang") as fake:
        t0 = time.monotonic()
        ok, detail = await generate_one_token(fake.url, 1.0)
        took = time.monotonic() - t0
    assert not ok and detail == "no answer within 1s" and 0.9 <= took < 5


@pytest.mark.asyncio
async def test_an_endless_answer_is_read_only_up_to_the_bound() -> None:
    """Finding 10: the probe read whole bodies from the user's vLLM server image (resp.json()): an image streaming an
    endless answer could exhaust the shared operator's memory. Now every read stops past MAX_BODY_BYTES."""
    from grpo_operator.controller.engine_probe import MAX_BODY_BYTES

    with FakeVllm("flood") as fake:
        ok, detail = await generate_one_token(fake.url, 30.0)
        sent = fake.sent
    assert not ok and f"longer than {MAX_BODY_BYTES} bytes" in detail, detail
    assert sent < 64 * 1024 * 1024  # the stand-in stopped when the probe hung up (socket buffers aside)


@pytest.mark.asyncio
async def test_nothing_listening_fails() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ok, detail = await generate_one_token(f"http://127.0.0.1:{port}", 2.0)
    assert not ok and detail


@pytest.mark.asyncio
async def test_probes_run_once_per_server_and_attempt_and_kick() -> None:
    kicked: list[tuple[str, str]] = []
    done = asyncio.Event()

    def kick(key: tuple[str, str]) -> None:
        kicked.append(key)
        done.set()

    probes = EngineProbes(kick)
    key = ("ns", "job")
    with FakeVllm("ok") as fake:
        probe = EngineProbe(pod="job-vllm-0", uid="u1", attempt=1, url=fake.url, timeout=5.0)
        probes.request(key, probe)
        probes.request(key, probe)  # decide() asks on every pass: one probe runs
        await asyncio.wait_for(done.wait(), 10)
        verdict = probes.verdict(key)
        assert verdict is not None and (verdict.uid, verdict.attempt, verdict.ok) == ("u1", 1, True)
        probes.request(key, probe)  # known: not run again
        await asyncio.gather(*(task for _, task in probes._tasks.values()))  # a probe started now has finished here
        assert fake.requests == 1 and kicked == [key]
        fake.mode = "error"
        done.clear()
        probes.request(key, EngineProbe(pod="job-vllm-0", uid="u1", attempt=2, url=fake.url, timeout=5.0))
        await asyncio.wait_for(done.wait(), 10)
        verdict = probes.verdict(key)
        assert verdict is not None and verdict.attempt == 2 and not verdict.ok
    probes.forget(key)
    assert probes.verdict(key) is None
    await probes.close()
