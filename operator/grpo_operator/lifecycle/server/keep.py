"""Server mode: a retryable trainer failure restarts the trainers and keeps a healthy vLLM server (issue 21 item 2;
the rules are server/order.py's). Two moments, both level-triggered:

  * at the restart (restart.py restart_for, kept_server): the server is kept when every server pod of the attempt
    is Running, Ready and has not failed, and order.server_wedged does not object (the failed trainers ran
    against a server kept from an earlier attempt and completed no logged optimizer step). The choice is recorded
    in status.vllmServerAttempt (the attempt that created the kept server) in the same status write that starts
    the next attempt, so a pass after a crash sorts the pods the same way (PodSets.sort): the kept server is the
    new attempt's, the old trainers are another attempt's and go;
  * before the next attempt's trainers are created (server/first.py server_first, verify_kept): the old trainers
    are gone (nothing can still be syncing), so the controller runs the engine probe (a 1-token generation, with a
    deadline) and passes its verdict in; a probe that failed or hung, or a kept server that is no longer Ready,
    replaces the server (not counted again: it is the same restart) and the attempt starts with a new server, in
    the order of item 1.

Under every gang policy the server is outside the trainers' gang (server/order.py): a PodGroup
(coscheduling, Volcano) counts only the trainers, and under Kueue the server is a pod group of its own, whose
Workload stays admitted while the trainers' group is refilled with the next attempt's trainers. A server that shares
the trainers' Kueue group (made by an older release) is not kept (GangPolicy.keeps_server)."""

from __future__ import annotations

from ... import api
from ...api.status import ConditionType
from ..conditions import parse_time
from ..draft import Draft, JobEvent
from ..pods import ROLE_TRAINER, ROLE_VLLM, PodInfo, PodPhase, classify
from . import order as so


def _healthy(p: PodInfo) -> bool:
    return p.live and p.ready and p.phase == PodPhase.RUNNING and classify(p) is None


def progressed(draft: Draft, trainers: list[PodInfo]) -> bool:
    """The failed trainer group logged at least one optimizer step: status.progress.updateTime (the trainer's last
    logging step) after the earliest start of its pods. Without progress (metrics off) it never did."""
    update = parse_time(draft.status.progress.updateTime if draft.status.progress is not None else None)
    starts = [t.start_time for t in trainers if t.start_time is not None]
    return update is not None and bool(starts) and update > min(starts)


def kept_server(draft: Draft) -> tuple[list[PodInfo], str]:
    """Before a retryable restart of the current attempt: the server pods to keep ([]: restart them too) and, when a
    rule refuses a healthy server, why."""
    job = draft.checked.job
    if job.spec.vllm.mode != "server":
        return [], ""
    servers = [p for p in draft.pods.current if p.role == ROLE_VLLM]
    if not servers or len(servers) != len(draft.expected) - draft.nodes or not all(_healthy(p) for p in servers):
        return [], ""
    trainers = [p for p in draft.pods.current if p.role == ROLE_TRAINER]
    if not draft.gang.keeps_server(servers, trainers):
        return [], ""
    evidence = so.SyncEvidence(server_reused=any(p.attempt < draft.pods.attempt for p in servers),
                               progressed=progressed(draft, trainers))
    wedged = so.server_wedged(evidence)
    return ([], wedged) if wedged else (servers, "")


def restart_keeping(draft: Draft) -> tuple[bool, str]:
    """Record the restart's choice before the next attempt begins (draft.next_attempt sorts by it): (server kept,
    a line for the restart's message)."""
    kept, why_not = kept_server(draft)
    if not kept:
        draft.status.vllmServerAttempt = None
        return False, f"; restarting the vLLM server too: {why_not}" if why_not else ""
    draft.status.vllmServerAttempt = min(p.attempt for p in kept)
    names = ", ".join(p.name for p in kept)
    return True, f"; keeping the Ready vLLM server {names} (its engine is checked before the trainers start)"


def verify_kept(draft: Draft, servers: list[PodInfo]) -> bool:
    """The current attempt has no trainers yet: a kept server (created by an earlier attempt) must pass the engine
    probe first. True: the pass is settled (probing, or the server is being replaced); False: go on."""
    kept = [p for p in servers if p.attempt < draft.pods.attempt]
    if not kept:
        draft.status.vllmServerAttempt = None  # no kept server (gone, or never): the attempt's own server
        return False
    sick = next((p for p in kept if not _healthy(p)), None)
    if sick is not None:
        return _replace(draft, kept, f"the kept vLLM server pod {sick.name} is no longer Ready and running")
    server = kept[0]
    verdict = draft.job.engine_probe
    if verdict is not None and verdict.uid == server.uid and verdict.attempt == draft.pods.attempt:
        if verdict.ok:
            return False
        why = so.server_wedged(so.SyncEvidence(engine_probe=False)) or ""
        return _replace(draft, kept, f"{why} ({verdict.detail})" if verdict.detail else why)
    port = (draft.spec.vllm.server or api.VllmServerSpec()).port
    if server.ip and server.uid:
        draft.decision.probe_server = so.EngineProbe(pod=server.name, uid=server.uid, attempt=draft.pods.attempt,
                                                     url=f"http://{server.ip}:{port}")
        draft.decision.requeue(so.ENGINE_PROBE_TIMEOUT + 5.0)
    else:
        draft.decision.requeue(draft.policy.expectation_ttl)
    _pending(draft, so.SERVER_KEPT, f"checking the kept vLLM server {server.name}: a 1-token generation before the trainers of "
                    f"attempt {draft.pods.attempt} start (deadline {so.ENGINE_PROBE_TIMEOUT:g}s)")
    return True


def _replace(draft: Draft, kept: list[PodInfo], why: str) -> bool:
    """The kept server cannot serve the next trainers: delete it; the attempt starts with a new one (the restart was
    counted when the trainers failed)."""
    draft.status.vllmServerAttempt = None
    draft.delete(kept)
    message = f"restarting the vLLM server: {why}"
    draft.decision.events.append(JobEvent("Warning", so.SERVER_WEDGED, message))
    _pending(draft, so.SERVER_WEDGED, message)
    return True


def _pending(draft: Draft, reason: str, message: str) -> None:
    draft.status.message = message
    draft.set(ConditionType.RUNNING, "False", reason, message)
