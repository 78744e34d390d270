"""What the client takes from the operator's own layers, in one place: phase and condition names (api), pod labels
and child names (render), the validator (rules). Imported lazily where it pulls pydantic models in."""

from __future__ import annotations

import typing

from grpo_trainer import contract as trainer_contract

from .. import api
from ..api import gang as g
from ..api.status import ConditionType, Phase
from ..lifecycle.conditions import parse_time as parse_time  # the one time parser, for the client
from ..lifecycle.pods import summarize_pod as summarize_pod  # the one pod summary: the client adds what it shows
from ..render import manifests

GROUP, VERSION, PLURAL, KIND, API_VERSION = api.GROUP, api.VERSION, api.PLURAL, api.KIND, api.API_VERSION

# Phases and condition types: the API layer's enums (members are strs: they compare equal to what the server returns).
PHASES: tuple[str, ...] = tuple(p.value for p in Phase)
PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED, REJECTED = (
    Phase.PENDING.value, Phase.RUNNING.value, Phase.RESTARTING.value, Phase.SUCCEEDED.value, Phase.FAILED.value,
    Phase.SUSPENDED.value, Phase.REJECTED.value)
C_CREATED, C_RUNNING, C_RESTARTING, C_SUCCEEDED, C_FAILED, C_SUSPENDED, C_REJECTED, C_UNSCHEDULABLE, C_QUEUED = (
    ConditionType.CREATED.value, ConditionType.RUNNING.value, ConditionType.RESTARTING.value,
    ConditionType.SUCCEEDED.value, ConditionType.FAILED.value, ConditionType.SUSPENDED.value,
    ConditionType.REJECTED.value, ConditionType.UNSCHEDULABLE.value, ConditionType.QUEUED.value)

LABEL_JOB = manifests.LABEL_JOB
LABEL_ROLE = manifests.LABEL_ROLE
LABEL_RANK = manifests.LABEL_RANK
# The attempt is read from the label when pods carry it, else from the annotation of the same key.
KEY_ATTEMPT = manifests.LABEL_ATTEMPT
ROLE_TRAINER = manifests.ROLE_TRAINER
TRAINER_CONTAINER = manifests.TRAINER_CONTAINER
QUEUE_LABEL = g.KUEUE_QUEUE_LABEL
KUEUE_GATE = g.KUEUE_ADMISSION_GATE
PROGRESS_PREFIX, HISTORY_PREFIX = trainer_contract.PROGRESS_PREFIX, trainer_contract.HISTORY_PREFIX


def names(job_name: str) -> manifests.Names:
    return manifests.names(job_name)


def validate(body: typing.Any) -> typing.Any:
    from ..rules import validation

    return validation.validate(body)


def render(body: typing.Any, namespace: str, uid: str, image: typing.Optional[str] = None) -> list[dict[str, typing.Any]]:
    """Every object the operator creates for a valid job body (`grpojob render`'s, with the default NetworkPolicy
    access), owned by the job's uid."""
    from ..render import job as render_job
    from ..render import netpol
    from ..rules import validation

    res = validation.validate(body)
    if res.job is None or res.topology is None:
        return []
    return render_job.render(res.job, res.topology, namespace, uid=uid, image=image or manifests.DEFAULT_TRAINER_IMAGE,
                             network_policy=netpol.Access())
