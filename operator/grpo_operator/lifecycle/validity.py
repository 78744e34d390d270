"""The first step: an invalid spec is Rejected (the webhook may be off); a valid one records topology and batch."""

from __future__ import annotations

from ..api.status import ConditionType, Phase, Reason
from .draft import Draft, active

BATCH_KEYS = ("worldSize", "nprocPerNode", "generationBatchSize", "stepsPerGeneration", "promptsPerGeneration")


def reject_invalid(draft: Draft) -> bool:
    """The webhook may be off: an invalid spec is Rejected here too, and has no pods. A valid one clears Rejected and
    records its topology and batch."""
    status, valid = draft.status, draft.valid
    if valid is None:
        message = draft.job.result.summary() or "invalid GRPOJob"
        status["phase"] = Phase.REJECTED
        status["message"] = f"invalid spec: {message}"
        draft.set(ConditionType.REJECTED, "True", Reason.INVALID_SPEC, message)
        draft.delete(active(draft.pods.ours))
        return True
    if draft.is_true(ConditionType.REJECTED):
        draft.set(ConditionType.REJECTED, "False", Reason.SPEC_VALID, "the spec is valid now")
        if status.get("phase") == Phase.REJECTED:
            status["phase"] = draft.phase = None
    status["topology"] = valid.topology.display()
    if valid.batch:
        status["batch"] = {k: valid.batch[k] for k in BATCH_KEYS if k in valid.batch}
    return False
