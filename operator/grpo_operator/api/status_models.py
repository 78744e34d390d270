"""The GRPOJob status as pydantic models (the CRD's status schema; lifecycle builds it, the client reads it), and
parse_status: how both read a status stored by the API server (leniently: it may come from an older operator or be
edited by hand)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from .status import ConditionType, Phase, listing

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(BaseModel):
    type: str = Field(description=f"Condition type: {', '.join(ConditionType)}.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human readable message.")
    lastTransitionTime: Optional[str] = Field(default=None, description="When the status last changed (RFC 3339).")
    observedGeneration: Optional[int] = Field(default=None, description="The .metadata.generation the condition was set for.")


class BatchStatus(BaseModel):
    worldSize: int = Field(description="Training processes: nodes × nprocPerNode (vLLM server GPUs excluded).")
    nprocPerNode: int = Field(description="Training processes per node.")
    generationBatchSize: int = Field(description="Completions generated per generation round (TRL generation_batch_size).")
    stepsPerGeneration: int = Field(description="Optimizer steps per generation round.")
    promptsPerGeneration: int = Field(description="Distinct prompts per generation round (generationBatchSize / numGenerations).")


class ProgressStatus(BaseModel):
    model_config = ConfigDict(extra="allow")
    step: Optional[int] = Field(default=None, description="Current optimizer step.")
    maxSteps: Optional[int] = Field(default=None, description="Total steps.")
    reward: Optional[float] = Field(default=None, description="Mean reward at the last logging step.")
    rewardStd: Optional[float] = Field(default=None, description="Reward standard deviation.")
    rewards: Optional[dict[str, float]] = Field(
        default=None, description="Mean of each reward function at the last logging step (unweighted), by name.")
    kl: Optional[float] = Field(default=None, description="KL to the reference model.")
    completionLength: Optional[float] = Field(default=None, description="Mean completion length (tokens).")
    learningRate: Optional[float] = Field(default=None, description="Learning rate.")
    tokensPerSecond: Optional[float] = Field(default=None, description="Training throughput.")
    etaSeconds: Optional[float] = Field(default=None, description="Estimated seconds left.")
    updateTime: Optional[str] = Field(default=None, description="When the trainer logged this step (RFC 3339).")
    display: Optional[str] = Field(default=None, description="step/maxSteps, for the STEP column.")
    attempt: Optional[int] = Field(default=None, description="The attempt (status.restarts) the scraped trainer belongs to.")
    inPlaceRestarts: Optional[int] = Field(
        default=None, description="runPolicy.restartPolicy InPlace: times torchrun restarted that attempt's worker "
        "processes inside their pods.")


class StagedRevision(BaseModel):
    kind: Literal["model", "dataset"] = Field(description="model (the policy or a reward model) or dataset.")
    repo: str = Field(description="The Hub repository.")
    revision: str = Field(default="", description="The revision the job asked for (a branch, tag or commit).")
    commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="The commit staging resolved it to and downloaded: "
                        "what the trainers and the vLLM server load.")


class InPlaceCount(BaseModel):
    attempt: int = Field(description="The attempt (status.restarts).")
    restarts: int = Field(description="Its in-place restarts counted so far.")


class GRPOJobStatus(BaseModel):
    phase: Optional[Phase] = Field(default=None, description=f"{listing(Phase)}.")
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations (Kubernetes API conventions).")
    batch: Optional[BatchStatus] = Field(default=None, description="The batch breakdown the operator validated.")
    progress: Optional[ProgressStatus] = Field(default=None, description="Live training progress reported by global rank 0.")
    restarts: int = Field(default=0, description="Gang restarts so far.")
    inPlaceRestarts: int = Field(
        default=0, description="runPolicy.restartPolicy InPlace: gang restarts done inside the running pods (worker "
        "processes restarted by torchrun, no new pods), all attempts together; they count against "
        "runPolicy.backoffLimit like status.restarts.")
    inPlaceCounted: Optional[InPlaceCount] = Field(
        default=None, description="The attempt whose in-place restarts were last counted into inPlaceRestarts, and "
        "how many of them (bookkeeping: each is counted once).")
    requeues: int = Field(
        default=0, description="Of the restarts, those Kueue caused (it evicted the pods) or a resume under Kueue began; "
        "they do not count against runPolicy.backoffLimit.")
    stagingRetries: int = Field(
        default=0, description="spec.cache: download pods that failed with a retryable error and were replaced "
        "(bounded by runPolicy.backoffLimit; docs/cache.md).")
    stagedRevisions: list[StagedRevision] = Field(
        default_factory=list, description="spec.cache: the commit of each Hub repository the download pod staged, "
        "recorded once; the job's pods load these commits, never a moving branch (docs/cache.md).")
    vllmServerAttempt: Optional[int] = Field(
        default=None, description="Server mode: the attempt that created the vLLM server pod the current attempt's "
        "trainers use, while that server is kept across trainer restarts (absent: the current attempt's own).")
    lastFailureReason: Optional[str] = Field(default=None, description="Why the last pod failure happened.")
    topology: Optional[str] = Field(default=None, description="nodes×GPUs, for the NODES×GPUS column.")
    startTime: Optional[str] = Field(default=None, description="When the pods were first created.")
    completionTime: Optional[str] = Field(default=None, description="When the job finished.")
    observedGeneration: Optional[int] = Field(default=None, description="Last .metadata.generation acted on.")
    specDigest: Optional[str] = Field(
        default=None, description="Digest of the spec the pods were rendered from (all of it but runPolicy): an edit "
        "of runPolicy or metadata moves the generation, not this, and never changes a started job's phase or pods.")
    message: Optional[str] = Field(default=None, description="Human readable summary of the phase.")

    def condition(self, ctype: str) -> Optional[Condition]:
        """The condition of this type (the first, should a hand-edited status repeat one); None when absent."""
        return next((c for c in self.conditions if c.type == ctype), None)

    def is_true(self, ctype: str) -> bool:
        c = self.condition(ctype)
        return c is not None and c.status == "True"

    def state(self) -> Optional[Phase]:
        """The job's state from its status alone: the phase, else the condition that is True (a status written
        without a phase), else None (the operator has not reported on the job yet)."""
        if self.phase is not None:
            return self.phase
        return next((phase for ctype, phase in _BY_CONDITION if self.is_true(ctype)), None)


# a status without a phase: the True condition that stands for one, in this order
_BY_CONDITION = ((ConditionType.FAILED, Phase.FAILED), (ConditionType.SUCCEEDED, Phase.SUCCEEDED),
                 (ConditionType.REJECTED, Phase.REJECTED), (ConditionType.SUSPENDED, Phase.SUSPENDED),
                 (ConditionType.RESTARTING, Phase.RESTARTING), (ConditionType.RUNNING, Phase.RUNNING),
                 (ConditionType.CREATED, Phase.PENDING))

M = TypeVar("M", bound=BaseModel)
_ROUNDS = 16  # each round drops at least one value; a status nests 4 deep


def parse_status(doc: Any) -> GRPOJobStatus:
    """A status as the API server stores it → GRPOJobStatus, never raising (parse_lenient)."""
    return parse_lenient(GRPOJobStatus, doc)


def parse_lenient(model: type[M], doc: Any) -> M:
    """`doc` as `model` (one whose fields all have defaults), leniently: unknown keys are ignored, an invalid value is
    dropped and the rest kept; a nested object that lacks a required field is dropped whole (a condition without a
    valid status). Anything but a mapping reads as empty. The fields the document held are the model's fields set
    (model_fields_set), so a dump with exclude_unset writes back what was there."""
    if isinstance(doc, dict):
        try:  # the common case, a valid document: validation copies what it keeps, so no copy of ours first
            return model.model_validate(doc)
        except ValidationError:
            pass
    data = _plain(doc) if isinstance(doc, Mapping) else {}
    for _ in range(_ROUNDS):
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            if not _drop(data, exc.errors()):
                break
    return model.model_validate({})


def _plain(value: Any) -> Any:
    """A copy made of dicts and lists (values dropped from it never touch the caller's document)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _drop(data: dict[str, Any], errors: list[ErrorDetails]) -> bool:
    """Remove the value each error names (for a missing field: the object that lacks it), following the error's
    location only as far as the document goes. False: nothing to remove."""
    paths: set[tuple[Any, ...]] = set()
    for err in errors:
        loc = err["loc"][:-1] if err["type"] == "missing" else err["loc"]
        path: list[Any] = []
        for key in loc:
            if _child(_at(data, path), key) is _ABSENT:
                break
            path.append(key)
        if path:
            paths.add(tuple(path))
    # children before their parents and later list items before earlier ones, so the other paths still hold
    # (two paths first differ inside one container: the keys compared there are all str or all int)
    for where in sorted(paths, reverse=True):
        parent = _at(data, list(where[:-1]))
        if isinstance(parent, (dict, list)) and _child(parent, where[-1]) is not _ABSENT:
            del parent[where[-1]]
    return bool(paths)


_ABSENT = object()


def _child(node: Any, key: Any) -> Any:
    if isinstance(node, dict):
        return node.get(key, _ABSENT)
    if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    return _ABSENT


def _at(data: Any, path: list[Any]) -> Any:
    for key in path:
        data = _child(data, key)
    return data
