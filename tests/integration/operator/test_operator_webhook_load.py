"""The webhook under a flood of the costliest reviews, while the same replica leads its Lease on the real control plane.

Finding 3 of issue 27: the webhook shared the operator's event loop with the Lease elector. With 200 reviews of the
costliest spec the CRD admits in flight, the TLS handshakes, request parsing and validation of those reviews delayed
the renewals past the renew deadline and the leader exited (renewals ~20 s apart; moving the validation alone onto
worker threads did not help). The elector now renews on its own thread and event loop, and the webhook bounds the
reviews it holds (a fast 429 past the bound).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.admission import review_request, worst_spec
from tests.support.cluster.util import free_port, wait_until
from tests.support.operator import OperatorProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

LEASE, RENEW, RETRY = 6.0, 4.0, 1.0  # a short renew deadline: a missed renewal ends the leader within the flood
IN_FLIGHT = 200
MIN_REVIEWS = 400
RENEWALS_UNDER_LOAD = 6  # the flood lasts at least this many renewals (each must come within the renew deadline)


class LeaseWatch:
    """Polls the Lease on a thread: when each new renewTime was first seen, and by whom."""

    def __init__(self, cp: Any, ns: str, name: str):
        self.cp, self.path = cp, f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"
        self.seen: list[tuple[float, str]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def spec(self) -> dict[str, Any]:
        try:
            r = self.cp.api("GET", self.path, timeout=5)
        except OSError:
            return {}
        return ((r.body or {}).get("spec") or {}) if r.status == 200 and isinstance(r.body, dict) else {}

    def _poll(self) -> None:
        last = None
        while not self.done.is_set():
            spec = self.spec()
            if spec.get("renewTime") and spec["renewTime"] != last:
                last = spec["renewTime"]
                self.seen.append((time.monotonic(), spec.get("holderIdentity") or ""))
            self.done.wait(0.1)

    def renewals_since(self, t: float) -> int:
        return sum(1 for at, _ in self.seen if at >= t)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)


async def flood(url: str, cafile: Path, lease: LeaseWatch, op: OperatorProcess) -> tuple[Counter[str], float]:
    """IN_FLIGHT reviews at all times until MIN_REVIEWS were answered and the Lease was renewed RENEWALS_UNDER_LOAD
    times since the flood began (or the operator died). Counts answers by kind: allowed, denied, busy (429), error."""
    bodies = [json.dumps(review_request(worst_spec(f"worst-{i}"))) for i in range(10)]
    ctx = ssl.create_default_context(cafile=str(cafile))
    counts: Counter[str] = Counter()
    t0 = time.monotonic()

    def enough() -> bool:
        if not op.proc.running:
            return True
        return sum(counts.values()) >= MIN_REVIEWS and lease.renewals_since(t0) >= RENEWALS_UNDER_LOAD

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=IN_FLIGHT),
                                     timeout=aiohttp.ClientTimeout(total=60)) as s:
        async def worker(i: int) -> None:
            while not enough():
                try:
                    async with s.post(url, data=bodies[i % len(bodies)],
                                      headers={"Content-Type": "application/json"}) as r:
                        resp = (await r.json())["response"]
                except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
                    counts["error"] += 1
                    if not op.proc.running:
                        return
                    continue
                code = (resp.get("status") or {}).get("code")
                counts["allowed" if resp["allowed"] else "busy" if code == 429 else "denied"] += 1

        await asyncio.gather(*(worker(i) for i in range(IN_FLIGHT)))
    return counts, time.monotonic() - t0


def test_the_leader_renews_on_time_under_200_worst_reviews_in_flight(crd, k8s_namespace, tmp_path):
    from grpo_operator.webhook import certs

    ns, cp = k8s_namespace, crd
    files = certs.generate(str(tmp_path / "certs"), ["127.0.0.1"])
    port = free_port()
    env = {"GRPO_LEADER_ELECT_LEASE_SECONDS": str(LEASE), "GRPO_LEADER_ELECT_RENEW_DEADLINE_SECONDS": str(RENEW),
           "GRPO_LEADER_ELECT_RETRY_SECONDS": str(RETRY)}
    op = OperatorProcess(crd.kubeconfig, tmp_path / "op", "--namespace", ns, "--leader-elect", "--leader-elect-lease",
                         f"{ns}/grpo-operator", "--webhook-listen", f"127.0.0.1:{port}",
                         "--webhook-cert-dir", str(tmp_path / "certs"), "--log-level", "WARNING", env=env)
    lease = LeaseWatch(cp, ns, "grpo-operator")
    try:
        op.start(wait=False)
        wait_until(lambda: op.proc.check_alive() or lease.seen, 90, 0.1, what="the operator leading")
        counts, took = asyncio.run(flood(f"https://127.0.0.1:{port}/validate", files.cafile, lease, op))
        alive = op.proc.running
        lease.stop()
        renewals = [at for at, _ in lease.seen]
        gaps = [b - a for a, b in zip(renewals, renewals[1:], strict=False)]
        print(f"\n{dict(counts)} in {took:.1f} s; {len(renewals)} renewals, longest gap {max(gaps, default=0):.2f} s")
        assert alive, f"the leader exited under the flood:\n{op.log(40)}"
        assert len({who for _, who in lease.seen}) == 1, "the Lease changed hands"
        assert max(gaps) < RENEW, f"a renewal came {max(gaps):.1f} s after the previous one (deadline {RENEW:g} s)"
        assert counts["denied"] > 0 and counts["allowed"] == 0, counts  # validated: the worst spec is refused
        assert counts["error"] == 0, counts  # every review answered (denied or busy), none dropped
    finally:
        lease.stop()
        op.stop()
