"""The admission decision (pure): the very validator behind `grpojob check`, plus the update rules.

webhook.server wires `review()` into kopf and serves it; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import api
from ..rules import validation
from ..rules.errors import MAX_ERRORS
from ..rules.limits import NO_LIMITS, Limits

# Spec fields a running job cannot change: its pods were rendered from them (topology, batch, model, data…).
MUTABLE_FIELDS = {"runPolicy"}
# Pod placement may change while the job is suspended (no pods exist): what Kueue does on admission.
MUTABLE_WHILE_SUSPENDED = {"template"}
WEBHOOK_CONFIG_NAME = "grpo-operator.grpo.dev"


@dataclass
class Review:
    allowed: bool
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    code: int = 422
    reason: str = ""  # a denial's first offending field (e.g. spec.training.numGenerations): the metrics label


def reason_label(path: str) -> str:
    """A denial's field as a bounded metrics label: list indices dropped (spec.rewards[2].name → spec.rewards.name),
    and a name the user made up (an unknown field or training argument) becomes `(unknown)`."""
    import re

    from ..api import trl_fields

    parts = [p for p in re.sub(r"\[\d+\]", "", path or "").split(".") if p]
    if not parts:
        return "(object)"
    if parts[0] != "spec":
        return ".".join(parts[:2]) if parts[0] == "metadata" and parts[1:2] in (["name"], ["namespace"], ["labels"]) \
            else parts[0] if parts[0] in ("metadata", "apiVersion", "kind") else "(unknown)"
    out: list[str] = ["spec"]
    model: Any = api.GRPOJobSpec
    for p in parts[1:]:
        if model is api.TrainingSpec:
            out.append(p if p in trl_fields.by_camel() else "(unknown)")
            break
        fields = getattr(model, "model_fields", None)
        if not fields:
            break
        if p not in fields:
            out.append("(unknown)")
            break
        out.append(p)
        ann = fields[p].annotation
        model = next((a for a in _models_in(ann)), None)
    return ".".join(out)


def _models_in(annotation: Any) -> Any:
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for a in typing.get_args(annotation):
        yield from _models_in(a)


# A denial is read by a person (kubectl prints it) and stored in no object: a few KiB say everything useful, whatever
# a tenant sent (a 250 KB refusal was seen before the validator capped its work).
MAX_LINE = 1024
MAX_MESSAGE = 8192


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _format_errors(name: str, res: validation.ValidationResult) -> str:
    lines = [_clip(f"GRPOJob {name!r} is invalid ({len(res.errors)} error{'s' if len(res.errors) != 1 else ''}):",
                   MAX_LINE)]
    for e in res.errors:
        lines.append(_clip(f"  * {e.field or '(object)'}: {e.message}", MAX_LINE))
    return _clip("\n".join(lines), MAX_MESSAGE)


def review(operation: str, new: Optional[Mapping[str, Any]], old: Optional[Mapping[str, Any]] = None,
           limits: Limits = NO_LIMITS) -> Review:
    """Admit or deny a GRPOJob CREATE/UPDATE (dicts as in the AdmissionReview), within the operator's `limits`."""
    if operation not in ("CREATE", "UPDATE") or new is None:
        return Review(True)
    if operation == "UPDATE" and (new.get("metadata") or {}).get("deletionTimestamp"):
        return Review(True)  # on its way out: finalizers and labels go as their owners need; nothing to validate
    doc: dict[str, Any] = {k: new.get(k) for k in ("apiVersion", "kind", "metadata", "spec") if k in new}
    name = (new.get("metadata") or {}).get("name") or (new.get("metadata") or {}).get("generateName") or "?"
    if isinstance(doc.get("metadata"), dict) and not doc["metadata"].get("name") and doc["metadata"].get("generateName"):
        doc["metadata"] = {**doc["metadata"], "name": doc["metadata"]["generateName"].rstrip("-.") or "job"}
    res = validation.validate(doc, limits)
    if not res.valid and operation == "UPDATE" and old is not None and _adds_no_error(new, old, res, limits):
        first = res.errors[0].field if res.errors else "spec"
        return Review(True, "", [f"today's rules refuse this job's stored spec ({len(res.errors)} error(s), first: "
                                 f"{first}); admitted: this update adds no error"])
    if not res.valid:
        return Review(False, _format_errors(str(name), res), list(res.warnings),
                      reason=reason_label(res.errors[0].field if res.errors else ""))
    warnings = [f"spec: {w}" if not w.startswith("spec") else w for w in res.warnings]
    if operation == "UPDATE" and old is not None:
        # every stored job's spec is immutable, whatever today's rules think of it; only one refused that never
        # started (no pods were ever rendered from it) may be fixed freely
        if not never_started_refused(old, limits):
            old_spec = old.get("spec") or {}
            new_spec = new.get("spec") or {}
            suspended = bool((old_spec.get("runPolicy") or {}).get("suspend")) and bool(
                (new_spec.get("runPolicy") or {}).get("suspend"))
            changed = sorted(k for k in set(old_spec) | set(new_spec)
                             if old_spec.get(k) != new_spec.get(k) and k not in MUTABLE_FIELDS
                             and not (suspended and k in MUTABLE_WHILE_SUSPENDED))
            if changed:
                fields = _clip(", ".join(f"spec.{k}" for k in changed[:MAX_ERRORS]), MAX_LINE)
                hint = " (spec.template may change only while the job is suspended)" if "template" in changed else ""
                return Review(False,
                              f"GRPOJob {name!r}: {fields} cannot change on an existing job: its pods, topology and batch "
                              f"were set up from them{hint}. Only spec.runPolicy (suspend, backoffLimit, "
                              f"activeDeadlineSeconds, ttlSecondsAfterFinished) and metadata may change. "
                              f"To change the others, delete the job and create a new one (it resumes from the "
                              f"checkpoints in spec.output).", warnings, reason=f"spec.{changed[0]}")
    return Review(True, "", warnings)


def _adds_no_error(new: Mapping[str, Any], old: Mapping[str, Any], res: validation.ValidationResult,
                   limits: Limits) -> bool:
    """An UPDATE of a job whose stored spec today's rules refuse (an operator upgrade tightened a rule): admitted when
    it changes only metadata and the mutable spec fields, and every error it has the stored object had already. A
    label, another controller's finalizer, suspending the job: never blocked by a rule the job predates."""
    old_spec, new_spec = old.get("spec"), new.get("spec")
    if not isinstance(old_spec, dict) or not isinstance(new_spec, dict):
        return old_spec == new_spec
    if any(old_spec.get(k) != new_spec.get(k) for k in set(old_spec) | set(new_spec) if k not in MUTABLE_FIELDS):
        return False
    old_doc = {k: old.get(k) for k in ("apiVersion", "kind", "metadata", "spec") if k in old}
    before = {(e.field, e.message) for e in validation.validate(old_doc, limits).errors}
    return all((e.field, e.message) in before for e in res.errors)


# Phases only a job whose pods were created reaches (lifecycle/draft.py STARTED_PHASES)
_STARTED_PHASES = ("Running", "Restarting", "Succeeded", "Failed")


def never_started_refused(old: Mapping[str, Any], limits: Limits) -> bool:
    """A stored job today's rules refuse and whose pods were never created, read from the stored object alone: its
    status has no startTime, no Created=True condition and no phase only pods reach. Such a job (typically Rejected
    from its first pass) has no pods, ConfigMap or checkpoints rendered from its spec: any edit may fix it."""
    found = old.get("status")
    status: dict[str, Any] = found if isinstance(found, dict) else {}
    listed = status.get("conditions")
    conditions: list[Any] = listed if isinstance(listed, list) else []
    created = any(isinstance(c, dict) and c.get("type") == "Created" and c.get("status") == "True" for c in conditions)
    if status.get("startTime") or created or status.get("phase") in _STARTED_PHASES:
        return False
    old_doc = {k: old.get(k) for k in ("apiVersion", "kind", "metadata", "spec") if k in old}
    return not validation.validate(old_doc, limits).valid
