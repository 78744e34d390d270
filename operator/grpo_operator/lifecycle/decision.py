"""Pure lifecycle decisions: (job, observed pods, now) → status, actions, events.

No kopf, no kubernetes client, no I/O. The controller feeds this module what it observed (controller/observers.py: the
job's body and compact summaries of its pods) and carries out the returned Decision (controller/writer.py). Every
decision is *level-triggered*: it is recomputed from the current observation, so a lost status write, a duplicated
event or an operator restart at any point converges to the same result.

State kept in the cluster (and only there):
  * status.restarts   — the current attempt number; pods carry it as the annotation grpo.dev/attempt.
                        Pods of an older attempt are stale and get deleted; pods of a newer attempt than
                        status says (a lost status write) raise status.restarts to their attempt.
  * the Restarting condition's lastTransitionTime — the start of the backoff before the next attempt.
  * status.startTime / completionTime — deadline and TTL anchors.

Failure classes (the trainer's exit-code contract):
  * exit 0                                   success
  * exit 1–127                               permanent: config/data/import/batch errors → Failed, no retry
  * exit ≥128, a signal, OOMKilled, Evicted,
    node lost (phase Unknown), a deleted pod  retryable → gang restart with exponential backoff, up to
                                             runPolicy.backoffLimit restarts
  * a trainer process failure in a healthy pod (runPolicy.restartPolicy InPlace): torchrun restarts the workers in
    the pods; the operator only counts it (status.inPlaceRestarts, against backoffLimit: lifecycle/inplace.py)

The steps live a module per concern (validity, terminal, suspend, restart, create, phase; the gang policy's hooks
in lifecycle/gangs); this module is their table of contents.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable

from . import gangs
from .create import create_pods, note_conflicts
from .draft import Decision, Draft, JobView, Policy
from .finish import finish
from .inplace import count_in_place
from .phase import phase_from_pods
from .pods import PodInfo
from .restart import adopt_newest_attempt, delete_other_attempts, restart_or_fail, wait_for_previous_attempt
from .server.first import server_first
from .staging import stage
from .stall import detect_stall
from .suspend import resume, suspend
from .terminal import enforce_deadline, keep_terminal
from .validity import reject_invalid

Step = Callable[[Draft], bool]

# The order matters: the first step that settles the job ends the pass. A new step goes where its precondition
# holds. Between wait_for_previous_attempt (the attempt may start) and create_pods (the trainers are created): the
# download step (spec.cache: the model and dataset fetched once, before any server or trainer) and the server step
# (server mode: a vLLM server Ready before the trainers), each settling the pass while it waits (docs/architecture.md).
STEPS: tuple[Step, ...] = (
    reject_invalid,             # an invalid spec: Rejected, no pods (else: clear Rejected, topology, batch)
    keep_terminal,              # Succeeded/Failed stay; what still runs is deleted; TTL
    adopt_newest_attempt,       # pods of a newer attempt than status.restarts (a lost write) win
    suspend,                    # runPolicy.suspend: no pods
    resume,                     # unsuspended: wait for the suspended pods to be gone
    enforce_deadline,           # runPolicy.activeDeadlineSeconds
    delete_other_attempts,      # pods of an older attempt go first
    count_in_place,             # in-place restarts the trainers report: status.inPlaceRestarts (never settles)
    note_conflicts,             # our pod names owned by something else
    restart_or_fail,            # failures of the current attempt: gang restart, or Failed
    wait_for_previous_attempt,  # the older attempt's pods still exist, or the backoff runs
    stage,                      # spec.cache: the download pod first; Staged=True before any server or trainer
    server_first,               # server mode: the vLLM server Ready before the trainers (its start-up deadline)
    create_pods,                # the current attempt's missing pods
    detect_stall,               # a running attempt whose step or a rank's heartbeat stopped: Stalled, stacks, onStall
    phase_from_pods,            # Succeeded / Running / Pending from the current attempt's pods
)


def decide(job: JobView, pods: Iterable[PodInfo], now: _dt.datetime, policy: Policy = Policy()) -> Decision:
    """The whole reconciliation: what the status should be and what to create/delete.

    A table of contents: every step reads and writes one Draft (the status being built, the decision, the pods
    sorted once, the gang policy chosen once); the first step that settles the job ends the pass.
    """
    if job.deleting:  # the gang releases what it holds; the pods go now, not when the garbage collector gets to them
        pods = list(pods)
        return deleted_job(job, pods)
    draft = Draft.begin(job, pods, now, policy)
    for step in STEPS:
        if step(draft):
            break
    return finish(draft)


def deleted_job(job: JobView, pods: Iterable[PodInfo]) -> Decision:
    """A job on its way out releases what its gang holds (else a gang scheduler may keep the quota for
    replacement pods that never come: lifecycle/gangs) and deletes its pods (deleted_job_pods)."""
    pods = list(pods)
    policy = gangs.for_job(job.result.job)
    release = policy.release([p for p in pods if p.owner_uid == job.uid])
    return Decision(status=None, release_pods=release, release=policy.releases if release else None,
                    delete_pods=deleted_job_pods(job, pods))


def deleted_job_pods(job: JobView, pods: Iterable[PodInfo]) -> list[str]:
    """A job on its way out deletes its own pods itself instead of leaving them to the garbage collector (its
    monitor of a custom resource can lag behind: a deleted job's pods were seen 120 s later). A finished pod goes at
    once; a running trainer gets SIGTERM, saves a checkpoint and exits within its grace period."""
    return [p.name for p in pods if p.owner_uid == job.uid and p.live]
