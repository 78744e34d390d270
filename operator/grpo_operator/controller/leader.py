"""Leader election on a coordination.k8s.io/v1 Lease, with fencing (`grpo-operator --leader-elect`).

Why not kopf peering: it pauses only kopf's own watch streams (our pod watch, resync, scraper and queue keep running on
a stale cache), has no compare-and-swap and no fencing. Why not the official client's `leaderelection`: threaded,
`sys.exit` on bad values, LeaseLock only from kubernetes 37.

The rules (controller-runtime's timings, 15/10/2 s by default):
  * a standby takes the Lease over only after its (holderIdentity, renewTime) stayed unchanged for the Lease's
    duration on the standby's *own monotonic clock* (no clock-skew dependence), or at once when it has no holder;
  * every write of the Lease is a PUT carrying the resourceVersion read: of two standbys racing, one gets a 409;
  * the holder renews every retry period, each renew bounded by what is left of the renew deadline (a hung request
    never outlives it); a holder whose last successful renew is older than the renew deadline has lost: it exits
    non-zero (never pauses and resumes: its caches and expectations would be stale);
  * `on_leading` (the new leader's login and re-list) runs beside the renew loop, so a slow re-list cannot starve the
    renewals; a failing one is retried with backoff, and a replica that could not start leading within the lease
    duration gives the Lease up and exits, so that a standby takes over instead of a leader that reconciles nothing;
  * fencing: every write calls `fence()` at the moment its request gets a connection, after any wait for the pool and
    on every retry (kube.py); it exits when the renew deadline has passed, which catches a process that was stopped
    (SIGSTOP, a GC stall, a frozen VM) before its renew task got to run. What remains is the synchronous step from
    that check to the socket write; status writes carry the resourceVersion they were decided from as the backstop.
The decisions are pure functions of (record, times) below; `Elector` does the I/O.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import os
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Optional

from . import kube as kube_mod

log = logging.getLogger("grpo_operator.leader")

LEASE_API = "/apis/coordination.k8s.io/v1"
EXIT_LOST = 3  # the exit status of a replica that lost its lease
FIRST_BACKOFF = 0.2  # seconds before the first retry of a failed on_leading; doubles up to the retry period


@dataclass(frozen=True)
class Timing:
    lease: float = 15.0  # leaseDurationSeconds written into the Lease
    renew_deadline: float = 10.0  # a holder that could not renew for this long stops acting
    retry: float = 2.0  # how often a holder renews and a standby looks

    def problem(self) -> Optional[str]:
        if not 0 < self.retry < self.renew_deadline < self.lease:
            return (f"leader election timings need 0 < retry ({self.retry:g}) < renew deadline "
                    f"({self.renew_deadline:g}) < lease duration ({self.lease:g})")
        return None


@dataclass(frozen=True)
class Record:
    """What a Lease says, as far as the election cares."""

    holder: str = ""
    renew_time: str = ""
    duration: float = 0.0
    transitions: int = 0
    resource_version: str = ""


def record_of(lease: dict[str, Any]) -> Record:
    spec = lease.get("spec") or {}
    return Record(holder=spec.get("holderIdentity") or "", renew_time=spec.get("renewTime") or "",
                  duration=float(spec.get("leaseDurationSeconds") or 0), transitions=int(spec.get("leaseTransitions") or 0),
                  resource_version=(lease.get("metadata") or {}).get("resourceVersion", ""))


class Observed:
    """The last distinct (holder, renewTime) a standby saw, and since when (its monotonic clock)."""

    def __init__(self) -> None:
        self.key: Optional[tuple[str, str]] = None
        self.since = 0.0

    def see(self, rec: Record, now: float) -> None:
        if (rec.holder, rec.renew_time) != self.key:
            self.key, self.since = (rec.holder, rec.renew_time), now


def standby_action(rec: Optional[Record], seen_since: float, now: float, me: str, timing: Timing) -> str:
    """'create' (no Lease yet), 'take' (no holder, ours, or expired by our own clock) or 'wait'."""
    if rec is None:
        return "create"
    if not rec.holder or rec.holder == me:
        return "take"
    duration = rec.duration if rec.duration > 0 else timing.lease
    return "take" if now - seen_since >= duration else "wait"


def may_act(leading: bool, last_renew: float, now: float, timing: Timing) -> bool:
    """Whether a replica may write now: it holds the Lease and renewed it within the renew deadline."""
    return leading and now - last_renew < timing.renew_deadline


def lease_seconds(timing: Timing) -> int:
    """leaseDurationSeconds is an integer: round up, so that a standby never waits less than the holder counts on."""
    return max(1, math.ceil(timing.lease))


def time_left(last_renew: float, now: float, timing: Timing) -> float:
    """Seconds a holder may still act (and has to renew in) before its renew deadline."""
    return last_renew + timing.renew_deadline - now


def micro_time(at: Optional[dt.datetime] = None) -> str:
    """A MicroTime as the API server writes it."""
    return (at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def exit_lost(why: str) -> None:
    """Stop acting at once: no graceful shutdown (it would write), a non-zero status (the kubelet restarts us as a
    fresh standby)."""
    log.error("leader election lost: %s; exiting", why)
    for h in logging.getLogger().handlers:
        h.flush()
    sys.stderr.flush()
    os._exit(EXIT_LOST)


class Fenced(Exception):
    """A write attempted by a replica that does not hold the Lease."""


class Elector:
    """Acquires and renews one Lease; calls `on_leading` once when acquired; `fence()` guards every write."""

    def __init__(self, kube: kube_mod.Kube, namespace: str, name: str, *, identity: Optional[str] = None,
                 timing: Timing = Timing(), on_leading: Optional[Callable[[], Awaitable[None]]] = None,
                 on_lost: Callable[[str], None] = exit_lost, clock: Callable[[], float] = time.monotonic):
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity = identity or default_identity()
        self.timing, self.on_leading, self.on_lost, self.clock = timing, on_leading, on_lost, clock
        self.leading = False
        self.last_renew = 0.0
        self.record: Optional[Record] = None
        self.observed = Observed()
        self.acquired_at: Optional[float] = None  # wall-clock, for the log and the tests
        self.acquire_time = ""  # the Lease's acquireTime as we wrote it
        self.leading_task: Optional[asyncio.Task[None]] = None  # on_leading, beside the renew loop

    @property
    def path(self) -> str:
        return f"{LEASE_API}/namespaces/{self.namespace}/leases/{self.name}"

    # ---------------------------------------------------------------- fencing
    def fence(self) -> None:
        if not self.leading:
            raise Fenced(f"{self.identity} does not hold lease {self.namespace}/{self.name}")
        if not may_act(self.leading, self.last_renew, self.clock(), self.timing):
            self.lost(f"no renew for {self.clock() - self.last_renew:.1f} s (deadline {self.timing.renew_deadline:g} s)")
            raise Fenced("lease lost")  # on_lost normally never returns

    def lost(self, why: str) -> None:
        self.leading = False
        self.on_lost(why)

    # ---------------------------------------------------------------- the loop
    async def run(self) -> None:
        log.info("leader election: %s contends for lease %s/%s", self.identity, self.namespace, self.name)
        while True:
            if self.leading and not may_act(True, self.last_renew, self.clock(), self.timing):
                # checked before renewing: a holder that was stopped past its deadline must not renew (the standbys
                # may have acted on its silence), only go
                self.lost(f"could not renew within {self.timing.renew_deadline:g} s")
                return
            try:
                if self.leading:
                    # a hard deadline: a renew still unanswered when the deadline passes is abandoned and the check
                    # above ends the replica (request timeouts alone, plus a re-read on conflict, outlive the lease)
                    await asyncio.wait_for(self._renew(), self._left())
                else:
                    await self._try_acquire()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an API hiccup: retry; the renew deadline decides when a holder gives up
                log.warning("leader election: %s: %s", type(exc).__name__, exc)
            # a holder wakes up at its deadline at the latest, to end itself there rather than a retry period later
            await asyncio.sleep(min(self.timing.retry, max(self._left(), 0.0)) if self.leading else self.timing.retry)

    def _left(self) -> float:
        return time_left(self.last_renew, self.clock(), self.timing)

    def _spec(self, transitions: int, acquire: bool) -> dict[str, Any]:
        now = micro_time()
        spec: dict[str, Any] = {"holderIdentity": self.identity, "leaseDurationSeconds": lease_seconds(self.timing),
                                "renewTime": now, "leaseTransitions": transitions}
        if acquire:
            self.acquire_time = now
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time  # a PUT replaces the spec: keep it on every renew
        return spec

    async def _try_acquire(self) -> None:
        try:
            lease = await self.kube.request("GET", self.path, fenced=False)
            rec: Optional[Record] = record_of(lease)
        except kube_mod.NotFound:
            lease, rec = None, None
        now = self.clock()
        if rec is not None:
            self.observed.see(rec, now)
        action = standby_action(rec, self.observed.since, now, self.identity, self.timing)
        if action == "wait":
            return
        started = self.clock()
        meta = {"name": self.name, "namespace": self.namespace}
        try:
            if lease is None or rec is None:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                        "spec": self._spec(0, True)}
                out = await self.kube.request("POST", f"{LEASE_API}/namespaces/{self.namespace}/leases", body=body,
                                              fenced=False)
            else:
                transitions = rec.transitions + (0 if rec.holder == self.identity else 1)
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {**meta, "resourceVersion": rec.resource_version},
                        "spec": self._spec(transitions, True)}
                out = await self.kube.request("PUT", self.path, body=body, fenced=False)
        except kube_mod.Conflict:
            return  # another replica won the race
        self.record, self.last_renew, self.leading = record_of(out), started, True
        self.acquired_at = time.time()
        log.info("leader election: %s acquired lease %s/%s (transition %d, previous holder %r)", self.identity,
                 self.namespace, self.name, self.record.transitions, rec.holder if rec else None)
        if self.on_leading is not None:
            self.leading_task = asyncio.get_running_loop().create_task(self._start_leading(self.on_leading),
                                                                       name="leader-on-leading")

    async def _start_leading(self, on_leading: Callable[[], Awaitable[None]]) -> None:
        """on_leading until it succeeds, with backoff; one that keeps failing for the lease duration gives the Lease up
        and ends the replica: a standby with a working API view takes over rather than a leader that acts on nothing."""
        give_up_at, delay = self.clock() + self.timing.lease, FIRST_BACKOFF
        while self.leading:
            try:
                await on_leading()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
            if self.clock() + delay >= give_up_at:
                await self.release()
                self.lost(f"could not start leading within the lease duration ({why})")
                return
            log.warning("leader election: starting to lead failed (%s); retrying in %.1f s", why, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, self.timing.retry)

    async def _renew(self) -> None:
        assert self.record is not None
        started = self.clock()
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": self.record.resource_version},
                "spec": self._spec(self.record.transitions, False)}
        try:
            out = await self.kube.request("PUT", self.path, body=body, fenced=False)
        except kube_mod.Conflict:
            rec = record_of(await self.kube.request("GET", self.path, fenced=False))
            if rec.holder != self.identity:
                self.lost(f"lease now held by {rec.holder or 'nobody'}")
                return
            self.record = rec  # ours, written by an earlier attempt whose answer we missed: retry with its version
            return
        if not may_act(True, self.last_renew, self.clock(), self.timing):
            self.lost("renewed only after the renew deadline")  # the standbys may have taken over meanwhile
            return
        self.record, self.last_renew = record_of(out), started

    async def release(self) -> None:
        """On a graceful shutdown, after the controller stopped: give the Lease up so a standby takes over at once."""
        if not self.leading or self.record is None:
            return
        self.leading = False
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": self.record.resource_version},
                "spec": {"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": micro_time(),
                         "leaseTransitions": self.record.transitions}}
        try:
            await self.kube.request("PUT", self.path, body=body, fenced=False)
            log.info("leader election: %s released lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as exc:  # the standbys take over after the lease duration anyway
            log.warning("leader election: release failed: %s", exc)
