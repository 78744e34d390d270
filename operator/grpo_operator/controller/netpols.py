"""Keeps a running job's NetworkPolicy equal to what render produces (level-triggered): the create path makes it with
the job's other children and treats an existing one as done, so a policy rendered under another operator
configuration (its namespace, pod labels, metrics port or metricsFrom) or edited by hand was never corrected - the
operator's probes and scrapes were then refused, or the job's pods left open.

Without a watch on NetworkPolicies, the live object is read when what render produces changes (a new operator
configuration, the first pass after a start) and again every RECHECK_RESYNCS resync periods (a hand edit); a
policy that differs is replaced (PUT on the resourceVersion read: a concurrent edit is a 409, decided again next
pass). A policy of that name the job does not own is the create path's to report, never overwritten here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Optional

from ..render import netpol
from ..rules import validation
from . import kube
from .settings import Settings
from .workqueue import Key

log = logging.getLogger("grpo_operator")

RECHECK_RESYNCS = 5  # a job's live policy is re-read at most once per this many resync periods (5 min by default)
KIND, API_VERSION = "NetworkPolicy", "networking.k8s.io/v1"


def fingerprint(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def differs(live: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether the live policy admits other than the rendered one, or lost its labels or owner: spec compared whole
    (the rendered spec sets every field the API server would default), labels and owner references as rendered."""
    lmeta, wmeta = live.get("metadata") or {}, want["metadata"]
    labels = lmeta.get("labels") or {}
    return (live.get("spec") != want["spec"]
            or any(labels.get(k) != v for k, v in (wmeta.get("labels") or {}).items())
            or lmeta.get("ownerReferences") != wmeta.get("ownerReferences"))


def owned_by(live: dict[str, Any], uid: str) -> bool:
    owners = [r for r in (live.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")]
    return bool(owners) and owners[0].get("uid") == uid


def replacement(live: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """The rendered policy as a PUT over `live`: its resourceVersion, and the labels and annotations others added."""
    lmeta = live.get("metadata") or {}
    meta = {**want["metadata"], "resourceVersion": lmeta.get("resourceVersion", ""),
            "labels": {**(lmeta.get("labels") or {}), **(want["metadata"].get("labels") or {})}}
    if lmeta.get("annotations"):
        meta["annotations"] = {**lmeta["annotations"], **(want["metadata"].get("annotations") or {})}
    return {**want, "metadata": meta}


class PolicyKeeper:
    """One per controller: `keep()` in every pass of a job that has pods."""

    def __init__(self, config: Settings, kube_of: Callable[[], Optional[kube.Kube]], sem: asyncio.Semaphore,
                 clock: Callable[[], float] = time.monotonic):
        self.config, self.kube_of, self.sem, self.clock = config, kube_of, sem, clock
        self.checked: dict[Key, tuple[str, float]] = {}  # the rendered policy's fingerprint, when the live one matched
        self.stats = {"replaced": 0}

    def forget(self, key: Key) -> None:
        self.checked.pop(key, None)

    async def keep(self, key: Key, uid: str, res: validation.ValidationResult) -> None:
        access, k = self.config.network_policy(), self.kube_of()
        if access is None or res.job is None or k is None:
            return
        want = netpol.network_policy(res.job, key[0], access, uid=uid, metrics_port=self.config.trainer_metrics_port)
        fp, now = fingerprint(want), self.clock()
        hit = self.checked.get(key)
        if hit is not None and hit[0] == fp and now - hit[1] < RECHECK_RESYNCS * self.config.resync_seconds:
            return
        name = want["metadata"]["name"]
        try:
            async with self.sem:
                live = await k.get(KIND, key[0], name, api_version=API_VERSION)
        except kube.NotFound:
            return  # deleted (by hand, or with the job): the next attempt's create path makes it again
        if not owned_by(live, uid):
            return
        if differs(live, want):
            try:
                async with self.sem:
                    await k.request("PUT", kube.path_for(KIND, key[0], name, api_version=API_VERSION),
                                    body=replacement(live, want), decode=False)
            except kube.Conflict:
                return  # changed since it was read: read and compare again next pass
            except kube.ApiError as exc:  # e.g. 403: an RBAC without `update` (charts before this release)
                log.warning("%s/%s: NetworkPolicy %s differs from the rendered one and cannot be replaced (%s %s); "
                            "grant the operator update on networkpolicies", key[0], key[1], name, exc.status,
                            exc.reason)
                self.checked[key] = (fp, now)  # said once per recheck period, not every pass
                return
            self.stats["replaced"] += 1
            log.info("%s/%s: NetworkPolicy %s differed from the rendered one; replaced", key[0], key[1], name)
        self.checked[key] = (fp, now)
