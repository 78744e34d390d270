"""Server mode's rules (pure; the clock passed in): the server before the trainers, its start-up deadline, and when a
server kept across a trainer restart is wedged. server/first.py and server/keep.py carry them out on the Draft.

The order (JobSet's dependsOn Ready, Kubeflow's runtimes): the operator creates the server pod(s) first and the
trainers only once every server pod is Ready (/health). TRL 1.16's client waits only vllm_server_timeout (240 s)
for the server, so trainers created next to a slow-loading server exit 202 and, before this, restarted the server.
plan() decides this order while the attempt has no trainers; once they exist, decide()'s usual steps rule.

Start-up deadline: spec.vllm.server.startupTimeoutSeconds, counted from the server pod's status.startTime (the
kubelet accepted it: queueing and scheduling do not count, image pull and model load do). Past it the attempt ends
as a retryable failure of the server (VllmServerStartupTimeout); the pod's startupProbe gives the kubelet the same
window, so the kubelet never kills a server the operator is still waiting for.

Restarts (server/keep.py):
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
  * a permanent trainer failure, success, suspend, the active deadline and give-up end both (decide()'s steps).

Gang admission and gang scheduling (lifecycle/gangs, docs/scheduling.md): a gang that holds the server and the
trainers cannot be created server-first — a scheduler that gates a group until all its pods exist, or holds its
first pod at Permit until minMember pods are there, would wait forever. So the server is NOT part of the trainers'
gang: render/manifests.py _gang makes the trainers the gang; a scheduler that admits pods by group gives the server
a group of its own (render/gangs/kueue.py; the lifecycle's choice: GangPolicy.group_of_new_pods by role), admitted
first and kept across trainer restarts; a PodGroup counts the trainers only and the server carries no mark.

May import api, lifecycle's pods and the standard library.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from ... import api
from ...api.status import Reason
from ..pods import Failure, PodInfo, PodPhase, classify

# Actions, in the order a healthy job meets them.
CREATE_SERVER = "CreateServer"
WAIT_FOR_SERVER = "WaitForServer"
CREATE_TRAINERS = "CreateTrainers"
RESTART_ALL = "RestartAll"  # the server failed: the attempt ends (a retryable failure); the next starts with the server

# Condition/Event reasons (status.lastFailureReason for the failures): api/status.py's, by the names the order uses
WAITING_FOR_SERVER = Reason.WAITING_FOR_VLLM_SERVER
SERVER_STARTUP_TIMEOUT = Reason.VLLM_SERVER_STARTUP_TIMEOUT
SERVER_FAILED = Reason.VLLM_SERVER_FAILED
SERVER_WEDGED = Reason.VLLM_SERVER_WEDGED
SERVER_KEPT = Reason.VLLM_SERVER_KEPT


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


def _server_failure(servers: Sequence[PodInfo]) -> Optional[Failure]:
    for s in servers:
        f = classify(s)
        if f is not None:
            # vLLM's exit codes are not the trainer's contract (it exits 1 for a CUDA OOM at load as for a bad
            # flag): every server failure is retryable, bounded by runPolicy.backoffLimit.
            return Failure(True, SERVER_FAILED, f"vLLM server {f.message}")
        if s.phase == PodPhase.SUCCEEDED:
            return Failure(True, SERVER_FAILED, f"vLLM server pod {s.name} exited 0: a server never should")
    return None


def _waiting(job: api.GRPOJob, servers: Sequence[PodInfo], now: _dt.datetime) -> ServerDecision:
    """A server not Ready: wait, or end the attempt past the start-up deadline."""
    timeout = (job.spec.vllm.server or api.VllmServerSpec()).startupTimeoutSeconds
    pending = [s for s in servers if not s.ready]
    unstarted = [s.name for s in pending if s.start_time is None]
    if unstarted:
        return ServerDecision(WAIT_FOR_SERVER, WAITING_FOR_SERVER,
                              f"waiting for the vLLM server: {', '.join(unstarted)} not yet on a node; the trainers "
                              f"start once every server pod is Ready")
    deadline = min(s.start_time for s in pending if s.start_time is not None) + _dt.timedelta(seconds=timeout)
    if now >= deadline:
        names = ", ".join(s.name for s in pending)
        return ServerDecision(RESTART_ALL, SERVER_STARTUP_TIMEOUT,
                              f"the vLLM server ({names}) was not Ready within startupTimeoutSeconds ({timeout}s)",
                              failure=Failure(True, SERVER_STARTUP_TIMEOUT,
                                              f"vLLM server {names} not Ready within {timeout}s "
                                              "(spec.vllm.server.startupTimeoutSeconds)"))
    left = (deadline - now).total_seconds()
    return ServerDecision(WAIT_FOR_SERVER, WAITING_FOR_SERVER,
                          f"waiting for the vLLM server to be Ready (/health): {len(servers) - len(pending)}/"
                          f"{len(servers)} Ready, {int(left)}s left of startupTimeoutSeconds ({timeout}s)",
                          requeue_after=left)


def plan(job: api.GRPOJob, servers: Sequence[PodInfo], now: _dt.datetime, expected_servers: int = 1) -> ServerDecision:
    """The server-first order of a server-mode attempt that has no trainers yet (server/first.py): `servers` its
    server pods, `expected_servers` how many it has."""
    live = [s for s in servers if not s.deleting]
    if len(live) < len(servers):  # a restart is deleting the old server: the next one waits for it
        return ServerDecision(WAIT_FOR_SERVER, WAITING_FOR_SERVER, "waiting for the old vLLM server pod to go")
    failure = _server_failure(live)
    if failure is not None:
        return ServerDecision(RESTART_ALL, SERVER_FAILED, failure.message, failure=failure)
    if len(live) < expected_servers:
        return ServerDecision(CREATE_SERVER, WAITING_FOR_SERVER,
                              "waiting for the vLLM server: creating it; the trainers start once it is Ready")
    if all(s.ready for s in live):
        return ServerDecision(CREATE_TRAINERS, "", "the vLLM server is Ready: creating the trainers")
    return _waiting(job, live, now)
