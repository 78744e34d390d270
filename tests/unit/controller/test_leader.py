"""Leader election (controller/leader.py): the pure timing decisions, the elector against an in-memory Lease with
the API server's compare-and-swap, fencing, and the flags."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import pytest

from grpo_operator.cli import grpo_operator as main
from grpo_operator.controller import kube as kube_mod
from grpo_operator.controller import leader
from grpo_operator.controller.leader import Record, Timing, may_act, standby_action

T = Timing(lease=15, renew_deadline=10, retry=2)


def test_standby_creates_a_missing_lease_and_takes_one_without_holder() -> None:
    assert standby_action(None, 0, 0, "me", T) == "create"
    assert standby_action(Record(holder=""), 100, 100, "me", T) == "take"
    assert standby_action(Record(holder="me", duration=15), 100, 100, "me", T) == "take"


def test_standby_waits_the_full_lease_duration_on_its_own_clock() -> None:
    rec = Record(holder="other", renew_time="2030-01-01T00:00:00.000000Z", duration=15)
    assert standby_action(rec, seen_since=100, now=114.9, me="me", timing=T) == "wait"
    assert standby_action(rec, seen_since=100, now=115.0, me="me", timing=T) == "take"
    # a lease without a duration: ours
    assert standby_action(Record(holder="o", duration=0), 100, 114, "me", T) == "wait"


def test_observed_restarts_the_wait_on_every_renew() -> None:
    seen = leader.Observed()
    seen.see(Record(holder="o", renew_time="t1"), 100)
    seen.see(Record(holder="o", renew_time="t1"), 110)
    assert seen.since == 100
    seen.see(Record(holder="o", renew_time="t2"), 112)
    assert seen.since == 112


def test_may_act_only_within_the_renew_deadline() -> None:
    assert may_act(True, last_renew=100, now=109.9, timing=T)
    assert not may_act(True, last_renew=100, now=110, timing=T)
    assert not may_act(False, last_renew=100, now=100, timing=T)


@pytest.mark.parametrize("t", [Timing(15, 15, 2), Timing(15, 10, 10), Timing(15, 10, 0)])
def test_bad_timings(t: Timing) -> None:
    assert t.problem()
    assert Timing().problem() is None


class FakeLeases:
    """One Lease, with the API server's resourceVersion compare-and-swap."""

    def __init__(self) -> None:
        self.lease: Optional[dict[str, Any]] = None
        self.rv = 0
        self.writes = 0

    async def request(self, method: str, path: str, *, body: Any = None, fenced: bool = True, **_: Any) -> Any:
        assert not fenced, "the elector's own writes must bypass the fence"
        if method == "GET":
            if self.lease is None:
                raise kube_mod.NotFound(404, "NotFound", "no lease")
            return self.lease
        if method == "POST" and self.lease is not None:
            raise kube_mod.Conflict(409, "AlreadyExists", "exists")
        if method == "PUT" and body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise kube_mod.Conflict(409, "Conflict", "modified")
        self.rv += 1
        self.writes += 1
        self.lease = {"metadata": {**body["metadata"], "resourceVersion": str(self.rv)}, "spec": body["spec"]}
        return self.lease

    async def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(leases: FakeLeases, name: str, clock: Clock, lost: list[str]) -> leader.Elector:
    return leader.Elector(leases, "ns", "lease", identity=name, timing=T,  # type: ignore[arg-type]
                          on_lost=lost.append, clock=clock)


@pytest.mark.asyncio
async def test_one_holder_a_standby_takes_over_only_after_the_lease_expired_and_the_old_one_is_fenced() -> None:
    leases, clock, lost_a, lost_b = FakeLeases(), Clock(), [], []
    a, b = elector(leases, "a", clock, lost_a), elector(leases, "b", clock, lost_b)
    await a._try_acquire()
    assert a.leading and leases.lease["spec"]["holderIdentity"] == "a"
    a.fence()  # fresh: may write
    await b._try_acquire()
    assert not b.leading
    with pytest.raises(leader.Fenced):
        b.fence()  # a standby never writes
    clock.now += 8
    await a._renew()
    clock.now += 14.9  # 22.9 s after b first looked, but b sees the renewed record now: its wait starts over
    await b._try_acquire()
    assert not b.leading
    # a is "stopped": no renew. b's clock runs on; a's writes are fenced once the renew deadline passed
    clock.now += 15
    await b._try_acquire()
    assert b.leading and leases.lease["spec"]["holderIdentity"] == "b"
    assert leases.lease["spec"]["leaseTransitions"] == 1
    with pytest.raises(leader.Fenced):
        a.fence()
    assert lost_a and not a.leading
    # a resumed and tries to renew with its old resourceVersion: a conflict, and it sees b
    a.leading, lost_a[:] = True, []
    await a._renew()
    assert lost_a and "held by b" in lost_a[0] and leases.lease["spec"]["holderIdentity"] == "b"


@pytest.mark.asyncio
async def test_two_standbys_racing_for_an_expired_lease_one_wins() -> None:
    leases, clock = FakeLeases(), Clock()
    old = elector(leases, "old", clock, [])
    await old._try_acquire()
    b, c = elector(leases, "b", clock, []), elector(leases, "c", clock, [])
    await b._try_acquire(), await c._try_acquire()
    clock.now += 16
    # both read the same version, then both PUT: the second PUT conflicts
    rec = leader.record_of(leases.lease)
    for e in (b, c):
        e.observed.see(rec, clock.now - 16)
    await asyncio.gather(b._try_acquire(), c._try_acquire())
    assert [b.leading, c.leading].count(True) == 1


@pytest.mark.asyncio
async def test_release_lets_a_standby_take_over_at_once() -> None:
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, "a", clock, []), elector(leases, "b", clock, [])
    await a._try_acquire()
    await a.release()
    assert not a.leading
    await b._try_acquire()
    assert b.leading


def test_write_path_calls_the_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fence() -> None:
        calls.append("fence")
        raise leader.Fenced("no")

    k = kube_mod.Kube(info=None)
    kube_mod.set_fence(fence)
    try:
        with pytest.raises(leader.Fenced):
            asyncio.run(k.request("PATCH", "/x", body={}))
        assert calls == ["fence"]
    finally:
        kube_mod.set_fence(None)


def test_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("GRPO_LEADER_ELECT", "GRPO_LEADER_ELECT_LEASE", "GRPO_PEERING", "GRPO_NAMESPACES", "POD_NAMESPACE"):
        monkeypatch.delenv(k, raising=False)
    cfg = main.parse_args(["-n", "team", "--leader-elect"])
    assert cfg.leader_elect and (cfg.leader_elect_lease or "").endswith("/grpo-operator")
    cfg = main.parse_args(["-A", "--leader-elect", "--leader-elect-lease", "ops/lock"])
    assert cfg.leader_elect_lease == "ops/lock"
    monkeypatch.setenv("GRPO_LEADER_ELECT", "true")
    monkeypatch.setenv("GRPO_LEADER_ELECT_LEASE", "x/y")
    assert main.parse_args(["-A"]).leader_elect_lease == "x/y"


@pytest.mark.parametrize("argv, env, words", [
    (["-A", "--leader-elect", "--leader-elect-lease", "nolease"], {}, "NAMESPACE/NAME"),
    (["-A", "--leader-elect", "--peering", "p"], {}, "mutually exclusive"),
    (["-A", "--leader-elect", "--no-controller"], {}, "needs the controller"),
    (["-A", "--leader-elect"], {"GRPO_LEADER_ELECT_RENEW_DEADLINE_SECONDS": "20"}, "renew deadline"),
])
def test_bad_leader_election_settings(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                      argv: list[str], env: dict[str, str], words: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        main.parse_args(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


# ---------------------------------------------------------------- issue 27: takeover, renew deadline, fencing at send
def test_lease_duration_is_rounded_up_not_truncated() -> None:
    """Finding (issue 27, Low): `leaseDurationSeconds=int(lease)` truncates: a 6.5 s lease was written as 6, so a
    standby could take over half a second before the holder's own deadline."""
    e = leader.Elector(FakeLeases(), "ns", "l", identity="a",  # type: ignore[arg-type]
                       timing=Timing(lease=6.5, renew_deadline=4, retry=1))
    assert e._spec(0, True)["leaseDurationSeconds"] == 7


class Flaky:
    """An on_leading whose first `fails` calls raise (a re-list that times out, a 429/5xx, a 410), each advancing the
    elector's clock by `step` seconds."""

    def __init__(self, clock: Clock, fails: int, step: float = 0.0) -> None:
        self.clock, self.fails, self.step, self.calls = clock, fails, step, 0

    async def __call__(self) -> None:
        self.calls += 1
        self.clock.now += self.step
        if self.calls <= self.fails:
            raise kube_mod.ApiError(503, "ServiceUnavailable", "list failed")


async def wait_task(e: leader.Elector) -> None:
    assert e.leading_task is not None
    await asyncio.wait_for(e.leading_task, 10)


@pytest.mark.asyncio
async def test_a_failed_takeover_relist_is_retried() -> None:
    """Finding (issue 27, High 2): a failed re-list at takeover left a leader that reconciles nothing: on_leading's
    error was swallowed by the elector's catch-all and never retried while the Lease kept being renewed."""
    leases, clock, lost = FakeLeases(), Clock(), []
    flaky = Flaky(clock, fails=2)
    e = leader.Elector(leases, "ns", "lease", identity="b", timing=T,  # type: ignore[arg-type]
                       on_leading=flaky, on_lost=lost.append, clock=clock)
    await e._try_acquire()
    await wait_task(e)
    assert flaky.calls == 3 and e.leading and not lost


@pytest.mark.asyncio
async def test_a_takeover_that_cannot_start_leading_gives_the_lease_up() -> None:
    """Finding (issue 27, High 2): past the lease duration of failed re-lists the replica releases the Lease and ends,
    so that a standby takes over (before: it kept renewing a Lease it did nothing with)."""
    leases, clock, lost = FakeLeases(), Clock(), []
    flaky = Flaky(clock, fails=1000, step=4.0)  # every attempt takes 4 s of the 15 s lease
    e = leader.Elector(leases, "ns", "lease", identity="b", timing=T,  # type: ignore[arg-type]
                       on_leading=flaky, on_lost=lost.append, clock=clock)
    await e._try_acquire()
    await wait_task(e)
    assert 3 <= flaky.calls <= 4, flaky.calls
    assert lost and "could not start leading" in lost[0] and "list failed" in lost[0]
    assert not e.leading and leases.lease is not None and leases.lease["spec"]["holderIdentity"] is None
    standby = elector(leases, "c", clock, [])
    await standby._try_acquire()
    assert standby.leading  # at once: released, not left to expire


class SlowLeases(FakeLeases):
    """A Lease API whose answers to the holder's renewals take `delay` seconds (None: never come)."""

    def __init__(self) -> None:
        super().__init__()
        self.delay: Optional[float] = 0.0

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        if method == "PUT" and self.lease is not None:
            if self.delay is None:
                await asyncio.Event().wait()
            await asyncio.sleep(self.delay)
        return await super().request(method, path, **kw)


FAST = Timing(lease=1.5, renew_deadline=1.0, retry=0.05)


@pytest.mark.asyncio
async def test_renewals_go_on_while_on_leading_runs() -> None:
    """Finding (issue 27, Medium 5): renewals waited while on_leading ran (login, full re-list): a re-list longer than
    the renew deadline made every new leader exit."""
    leases, lost = SlowLeases(), []
    relist_done = asyncio.Event()

    async def slow_relist() -> None:
        await relist_done.wait()

    e = leader.Elector(leases, "ns", "lease", identity="a", timing=FAST,  # type: ignore[arg-type]
                       on_leading=slow_relist, on_lost=lost.append)
    task = asyncio.create_task(e.run())
    try:
        await asyncio.sleep(2 * FAST.lease)  # the re-list takes longer than the lease
        assert e.leading and not lost and leases.writes >= 10
        relist_done.set()
        await wait_task(e)
    finally:
        task.cancel()


@pytest.mark.asyncio
async def test_a_hung_renew_ends_the_holder_at_its_renew_deadline() -> None:
    """Finding (issue 27, Medium 6): a renew had no deadline of its own: request timeouts (two of them with the re-read
    after a conflict) plus retry sleeps outlived the lease, while the holder still counted as leading."""
    leases, lost = SlowLeases(), []
    e = leader.Elector(leases, "ns", "lease", identity="a", timing=FAST,  # type: ignore[arg-type]
                       on_lost=lost.append)
    task = asyncio.create_task(e.run())
    try:
        for _ in range(200):
            if e.leading:
                break
            await asyncio.sleep(0.01)
        leases.delay = None  # from now on every renew hangs
        hung = asyncio.get_running_loop().time()
        await asyncio.wait_for(task, 5)
        took = asyncio.get_running_loop().time() - hung
        assert lost and not e.leading
        assert took < FAST.lease, took  # gone before a standby could take over
    finally:
        task.cancel()
