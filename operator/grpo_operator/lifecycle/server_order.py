"""vLLM server mode: the server before the trainers, and what a restart keeps. Pure decisions (clock passed in).

The order (JobSet's dependsOn Ready, Kubeflow's runtimes): the operator creates the server pod(s) first and the
trainers only once every server pod is Ready (/health). TRL 1.16's client waits only vllm_server_timeout (240 s)
for the server, so trainers created next to a slow-loading server exit 202 and, before this, restarted the server.

Start-up deadline: spec.vllm.server.startupTimeoutSeconds, counted from the server pod's status.startTime (the
kubelet accepted it: queueing and scheduling do not count, image pull and model load do). Past it the attempt ends
as a retryable failure of the server (VllmServerStartupTimeout); the pod's startupProbe gives the kubelet the same
window, so the kubelet never kills a server the operator is still waiting for.

Restarts:
  * a retryable trainer failure restarts the trainers and keeps a Ready server: the new trainer group calls
    init_weight_transfer_engine again, which replaces the server's communicator, and TRL pushes full weights before
    it generates (TRL 1.16's vllm-serve takes a new group's init as a replacement);
  * except a wedged server (server_wedged): a trainer that died inside a weight sync leaves the server's workers
    blocked in an NCCL receive, or its _weight_update_active flag set, while /health still answers 200. What the
    operator can observe decides:
      1. the engine probe (a 1-token generation against the server, run by the controller after the trainers
         stopped, with a deadline) failed or hung → the workers are blocked: restart the server too;
      2. the failed trainer group ran against a server kept from an earlier attempt and completed no optimizer
         step → its first weight sync may have hit a half-finished one: restart the server too. This bounds a
         wedge the probe cannot see (the flag case) to one lost trainer attempt;
      otherwise keep the server;
  * a server failure (Failed, node lost, the start-up deadline) restarts the server and then the trainers, in
    the order above; it is retryable and counts against runPolicy.backoffLimit like a trainer's;
  * a permanent trainer failure, success, suspend, the active deadline and give-up end both (decide() as before;
    ending() lists the pods).

Gang admission and gang scheduling (lifecycle/gang.py, docs/scheduling.md): a gang that holds the server and
the trainers cannot be created server-first — Kueue keeps a pod group's pods gated until all total-count pods
exist, and a coscheduling/Volcano PodGroup holds its first pod at Permit until minMember pods are there — so the
server-only creation would wait forever. Decision (gang_groups): the server is NOT part of the trainers' gang.
Under Kueue it forms a pod group of its own (total-count = server pods, <job>-<uid>-vllm-a<attempt the run began
at>), so it is admitted first, holds its quota across trainer restarts and is replaced only with the server; the trainers
form the attempt's group with total-count = nodes. With a PodGroup, minMember = nodes (trainers only) and the
server pod carries no PodGroup label.

May import api, lifecycle's pods/gang/conditions, grpo_trainer.contract and the standard library.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from .. import api
from . import gangs
from .pods import Failure, PodInfo, PodPhase, classify, summarize_pod

# Actions, in the order a healthy job meets them.
CREATE_SERVER = "CreateServer"
WAIT_FOR_SERVER = "WaitForServer"
CREATE_TRAINERS = "CreateTrainers"
PROCEED = "Proceed"  # nothing server-specific to do: decide() as in colocate mode
RESTART_TRAINERS = "RestartTrainers"  # delete the trainers only; the server stays
RESTART_ALL = "RestartAll"  # delete the server and the trainers; the next attempt starts with the server

# Condition/Event reasons (status.lastFailureReason for the failures).
WAITING_FOR_SERVER = "WaitingForVllmServer"
SERVER_STARTUP_TIMEOUT = "VllmServerStartupTimeout"
SERVER_FAILED = "VllmServerFailed"
SERVER_WEDGED = "VllmServerWedged"
SERVER_KEPT = "VllmServerKept"


@dataclass(frozen=True)
class ServerPod:
    """What the order needs to know about one server pod."""

    pod: PodInfo
    ready: bool = False  # the Ready condition: the /health readiness probe passes
    started: Optional[_dt.datetime] = None  # status.startTime: the kubelet accepted it
    restarts: int = 0  # containerStatuses[].restartCount (restartPolicy Never: 0 unless changed)


def observe_server(body: Mapping[str, Any]) -> ServerPod:
    """A server pod's body → ServerPod. Tolerates any missing field."""
    status = body.get("status") or {}
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
    pod = summarize_pod(body)
    return ServerPod(pod=pod, ready=pod.ready, started=pod.start_time, restarts=restarts)


def server_of(pod: PodInfo) -> ServerPod:
    """A server pod's summary (what the operator's pod index keeps) → ServerPod."""
    return ServerPod(pod=pod, ready=pod.ready, started=pod.start_time)


@dataclass(frozen=True)
class SyncEvidence:
    """What tells a kept server from a wedged one after the trainers failed (see the module docstring)."""

    engine_probe: Optional[bool] = None  # True: a 1-token generation answered; False: failed/hung; None: not run
    server_reused: bool = False  # the failed trainer group ran against a server kept from an earlier attempt
    progressed: bool = False  # the failed trainer group completed at least one optimizer step


# How long the controller waits for the engine probe's 1-token generation: a loaded engine answers in well under a
# second; workers blocked in an NCCL receive never answer.
ENGINE_PROBE_TIMEOUT = 60.0


@dataclass(frozen=True)
class EngineProbe:
    """A request to the controller: run a 1-token generation against this kept server pod (its OpenAI API at `url`:
    GET /v1/models, then POST /v1/completions with max_tokens 1, as TRL's client generates) within `timeout`."""

    pod: str
    uid: str
    attempt: int  # the attempt whose trainers would use the server: a verdict counts for this attempt only
    url: str
    timeout: float = ENGINE_PROBE_TIMEOUT


@dataclass(frozen=True)
class ProbeVerdict:
    """What the engine probe found (the controller's answer to an EngineProbe)."""

    uid: str
    attempt: int
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class ServerDecision:
    action: str
    reason: str = ""
    message: str = ""
    failure: Optional[Failure] = None  # a retryable failure to count (the server's; a trainer's is decide()'s)
    delete: tuple[str, ...] = ()  # pod names to delete now
    requeue_after: Optional[float] = None  # seconds until the start-up deadline, for the controller's timer


def server_wedged(evidence: SyncEvidence) -> Optional[str]:
    """Why a Ready server must not be kept after a trainer failure (None: keep it)."""
    if evidence.engine_probe is False:
        return ("the vLLM engine did not answer a 1-token generation after the trainers stopped: its workers are "
                "blocked in an unfinished weight sync")
    if evidence.server_reused and not evidence.progressed:
        return ("the trainers that reused this vLLM server failed before their first step: a weight sync left "
                "half-finished by the earlier trainers may have wedged it")
    return None


def _server_failure(servers: Sequence[ServerPod]) -> Optional[Failure]:
    for s in servers:
        f = classify(s.pod)
        if f is not None:
            # vLLM's exit codes are not the trainer's contract (it exits 1 for a CUDA OOM at load as for a bad
            # flag): every server failure is retryable, bounded by runPolicy.backoffLimit.
            return Failure(True, SERVER_FAILED, f"vLLM server {f.message}")
        if s.pod.phase == PodPhase.SUCCEEDED:
            return Failure(True, SERVER_FAILED, f"vLLM server pod {s.pod.name} exited 0: a server never should")
    return None


def _waiting(job: api.GRPOJob, servers: Sequence[ServerPod], now: _dt.datetime) -> ServerDecision:
    """No trainers yet and a server not Ready: wait, or end the attempt past the start-up deadline."""
    timeout = (job.spec.vllm.server or api.VllmServerSpec()).startupTimeoutSeconds
    pending = [s for s in servers if not s.ready]
    unstarted = [s.pod.name for s in pending if s.started is None]
    if unstarted:
        return ServerDecision(WAIT_FOR_SERVER, WAITING_FOR_SERVER,
                              f"waiting for the vLLM server: {', '.join(unstarted)} not yet on a node; the trainers "
                              f"start once every server pod is Ready")
    deadline = min(s.started for s in pending if s.started is not None) + _dt.timedelta(seconds=timeout)
    if now >= deadline:
        names = ", ".join(s.pod.name for s in pending)
        return ServerDecision(RESTART_ALL, SERVER_STARTUP_TIMEOUT,
                              f"the vLLM server ({names}) was not Ready within startupTimeoutSeconds ({timeout}s)",
                              failure=Failure(True, SERVER_STARTUP_TIMEOUT,
                                              f"vLLM server {names} not Ready within {timeout}s "
                                              "(spec.vllm.server.startupTimeoutSeconds)"),
                              delete=tuple(s.pod.name for s in servers))
    left = (deadline - now).total_seconds()
    return ServerDecision(WAIT_FOR_SERVER, WAITING_FOR_SERVER,
                          f"waiting for the vLLM server to be Ready (/health): {len(servers) - len(pending)}/"
                          f"{len(servers)} Ready, {int(left)}s left of startupTimeoutSeconds ({timeout}s)",
                          requeue_after=left)


def plan(job: api.GRPOJob, servers: Sequence[ServerPod], trainers: Sequence[PodInfo], now: _dt.datetime,
         evidence: SyncEvidence = SyncEvidence(), expected_servers: int = 1) -> ServerDecision:
    """The server-mode step for the current attempt's pods (old attempts' pods are decide()'s). PROCEED outside
    server mode and whenever decide()'s own rules apply unchanged."""
    if job.spec.vllm.mode != "server":
        return ServerDecision(PROCEED)
    live = [s for s in servers if not s.pod.deleting]
    trainers_live = [t for t in trainers if not t.deleting]
    if len(live) < len(servers):  # a restart is deleting the old server: the next one waits for it
        return ServerDecision(WAIT_FOR_SERVER, WAITING_FOR_SERVER, "waiting for the old vLLM server pod to go")
    failure = _server_failure(live)
    if failure is not None:
        return ServerDecision(RESTART_ALL, SERVER_FAILED, failure.message, failure=failure,
                              delete=tuple(p.name for p in [*(s.pod for s in live), *trainers_live]))
    if len(live) < expected_servers:
        if trainers_live:  # the server went away under running trainers (deleted by hand): a server failure
            f = Failure(True, SERVER_FAILED, "the vLLM server pod disappeared while the trainers ran")
            return ServerDecision(RESTART_ALL, SERVER_FAILED, f.message, failure=f,
                                  delete=tuple(p.name for p in [*(s.pod for s in live), *trainers_live]))
        return ServerDecision(CREATE_SERVER, WAITING_FOR_SERVER,
                              "waiting for the vLLM server: creating it; the trainers start once it is Ready")
    if not trainers_live:
        if all(s.ready for s in live):
            return ServerDecision(CREATE_TRAINERS, SERVER_KEPT if evidence.server_reused else "",
                                  "the vLLM server is Ready: creating the trainers")
        return _waiting(job, live, now)
    return _after_trainer_failure(live, trainers_live, evidence)


def _after_trainer_failure(servers: Sequence[ServerPod], trainers: Sequence[PodInfo],
                           evidence: SyncEvidence) -> ServerDecision:
    """Trainers exist: a retryable trainer failure restarts the trainers and keeps the server unless it is wedged;
    anything else (running, succeeded, a permanent failure) is decide()'s."""
    failures = [f for f in (classify(t) for t in trainers) if f is not None]
    if not failures or not all(f.retryable for f in failures):
        return ServerDecision(PROCEED)
    wedged = server_wedged(evidence)
    trainer_names = tuple(t.name for t in trainers)
    if wedged is not None:
        return ServerDecision(RESTART_ALL, SERVER_WEDGED, f"{failures[0].message}; restarting the vLLM server too: "
                              f"{wedged}", delete=tuple(s.pod.name for s in servers) + trainer_names)
    return ServerDecision(RESTART_TRAINERS, SERVER_KEPT,
                          f"{failures[0].message}; restarting the trainers, keeping the Ready vLLM server",
                          delete=trainer_names)


def ending(servers: Sequence[ServerPod], trainers: Sequence[PodInfo]) -> tuple[str, ...]:
    """Suspend, the active deadline, give-up and success end both: every live pod, the server included."""
    return tuple(p.name for p in [*(s.pod for s in servers), *trainers] if not p.deleting)


@dataclass(frozen=True)
class GroupPlan:
    """One role's gang membership: the Kueue pod group's total-count or the PodGroup's minMember it counts in
    (None: not in any group), and whether the group outlives a trainer-only restart."""

    count: Optional[int]
    kept_across_trainer_restarts: bool


def gang_groups(mode: str, nodes: int, servers: int = 1) -> dict[str, GroupPlan]:
    """The server's and the trainers' groups per gang mode (see the module docstring for why they are apart)."""
    if mode == gangs.NONE:
        return {"server": GroupPlan(None, True), "trainers": GroupPlan(None, False)}
    if mode == gangs.kueue.KueueGang.mode:
        return {"server": GroupPlan(servers, True), "trainers": GroupPlan(nodes, False)}
    if mode in (gangs.coscheduling.CoschedulingGang.mode, gangs.volcano.VolcanoGang.mode):
        return {"server": GroupPlan(None, True), "trainers": GroupPlan(nodes, False)}
    raise ValueError(f"unknown gang mode {mode!r}")
