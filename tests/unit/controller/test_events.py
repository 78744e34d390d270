"""The background Event recorder: every recorded Event is posted, in order per writer, off the caller's path;
a full queue drops and counts; close() flushes what is queued."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from grpo_operator import lifecycle
from grpo_operator.controller import events
from grpo_operator.controller import metrics as opmetrics

JOB = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
       "metadata": {"name": "j1", "namespace": "team-a", "uid": "u-1", "resourceVersion": "7"}}


def ev(i: int) -> lifecycle.JobEvent:
    return lifecycle.JobEvent(type="Normal", reason="Pending", message=f"message {i} " + "x" * 2000)


def test_event_object_is_a_core_event_about_the_job() -> None:
    obj = events.event_object(JOB, ev(1), "2026-11-29T10:00:00Z")
    assert obj["kind"] == "Event" and obj["metadata"]["namespace"] == "team-a"
    assert obj["metadata"]["name"].startswith("j1.") and len(obj["metadata"]["name"]) == len("j1.") + 16
    assert obj["involvedObject"] == {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "name": "j1",
                                     "namespace": "team-a", "uid": "u-1", "resourceVersion": "7"}
    assert obj["reason"] == "Pending" and obj["type"] == "Normal" and len(obj["message"]) == 1024
    assert obj["firstTimestamp"] == obj["lastTimestamp"] == "2026-11-29T10:00:00Z"
    assert events.event_object(JOB, ev(1), "t")["metadata"]["name"] != obj["metadata"]["name"]


@pytest.mark.asyncio
async def test_record_returns_at_once_and_every_event_is_posted() -> None:
    posted: list[tuple[str, str]] = []
    gate = asyncio.Event()

    async def post(ns: str, obj: dict[str, Any]) -> None:
        await gate.wait()  # a slow API server
        posted.append((ns, obj["message"].split(" x")[0]))

    rec = events.EventRecorder(post, writers=2)
    for i in range(10):
        rec.record(JOB, ev(i))  # synchronous: never waits for the API server
    assert posted == []
    gate.set()
    await rec.close(flush_seconds=5)
    assert sorted(m for _, m in posted) == sorted(f"message {i}" for i in range(10))
    assert {ns for ns, _ in posted} == {"team-a"}


@pytest.mark.asyncio
async def test_a_full_queue_drops_and_counts_and_a_failing_post_does_not_stop_the_writers() -> None:
    calls = 0

    async def post(ns: str, obj: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("API server said 500")
        await asyncio.sleep(0)

    before = opmetrics.EVENTS_DROPPED._value.get()
    rec = events.EventRecorder(post, writers=1, capacity=3)
    for i in range(5):
        rec.record(JOB, ev(i))
    assert opmetrics.EVENTS_DROPPED._value.get() - before == 2
    await rec.close(flush_seconds=5)
    assert calls == 3  # the first failed, the writer went on with the other two
    rec.record(JOB, ev(9))  # usable again after close: writers restart
    await rec.close(flush_seconds=5)
    assert calls == 4


@pytest.mark.asyncio
async def test_close_gives_up_after_flush_seconds() -> None:
    async def post(ns: str, obj: dict[str, Any]) -> None:
        await asyncio.sleep(3600)

    rec = events.EventRecorder(post, writers=1)
    rec.record(JOB, ev(1))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await rec.close(flush_seconds=0.2)
    assert loop.time() - t0 < 2


@pytest.mark.asyncio
async def test_an_event_waits_while_every_write_slot_is_taken_then_goes() -> None:
    posted: list[str] = []
    polled = asyncio.Event()
    polls = 0
    busy = True

    def is_busy() -> bool:
        nonlocal polls
        polls += 1
        if polls >= 3:
            polled.set()
        return busy

    async def post(ns: str, obj: dict[str, Any]) -> None:
        posted.append(obj["reason"])

    rec = events.EventRecorder(post, writers=1, busy=is_busy)
    rec.record(JOB, ev(1))
    await asyncio.wait_for(polled.wait(), 30)  # the writer looked three times and found the writes busy
    assert posted == []
    busy = False
    await rec.close(flush_seconds=30)
    assert posted == ["Pending"]


@pytest.mark.asyncio
async def test_an_event_is_held_back_at_most_max_defer() -> None:
    posted = asyncio.Event()

    async def post(ns: str, obj: dict[str, Any]) -> None:
        posted.set()

    rec = events.EventRecorder(post, writers=1, busy=lambda: True, max_defer=0.3)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    rec.record(JOB, ev(1))
    await asyncio.wait_for(posted.wait(), 30)  # posted although the writes never stop
    assert loop.time() - t0 >= 0.3
    await rec.close(flush_seconds=5)
