"""Time stamps and status.conditions[] (Kubernetes API conventions, as api.Condition), pure."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from .. import api


def now_utc() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def fmt_time(t: _dt.datetime) -> str:
    return t.astimezone(_dt.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: Any) -> Optional[_dt.datetime]:
    """An RFC 3339 string (or a datetime, as the kubernetes client returns them) → an aware datetime; None for
    anything else."""
    if isinstance(s, _dt.datetime):
        return s if s.tzinfo else s.replace(tzinfo=_dt.UTC)
    if not isinstance(s, str) or not s:
        return None
    try:
        t = _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    return t


def set_condition(conditions: list[api.Condition], ctype: str, status: api.ConditionStatus, reason: str, message: str,
                  now: _dt.datetime, generation: Optional[int], *, force_transition: bool = False) -> None:
    """Upsert a condition in place; lastTransitionTime changes only when status changes (or forced)."""
    ctype, reason = str(ctype), str(reason)  # api.status members as the plain strings the API server returns
    for cond in conditions:
        if cond.type == ctype:
            if cond.status != status or force_transition or not cond.lastTransitionTime:
                cond.lastTransitionTime = fmt_time(now)
            cond.status, cond.reason, cond.message = status, reason, message
            if generation is not None:
                cond.observedGeneration = generation
            return
    cond = api.Condition(type=ctype, status=status, reason=reason, message=message, lastTransitionTime=fmt_time(now))
    if generation is not None:
        cond.observedGeneration = generation
    conditions.append(cond)


def get_condition(conditions: Iterable[Mapping[str, Any]], ctype: str) -> Optional[Mapping[str, Any]]:
    """A condition of a status as written (JSON: Decision.status); the steps read the typed one (api.GRPOJobStatus)."""
    return next((c for c in conditions if c.get("type") == ctype), None)


def is_true(conditions: Iterable[Mapping[str, Any]], ctype: str) -> bool:
    c = get_condition(conditions, ctype)
    return bool(c and c.get("status") == "True")


def clear_condition(conditions: list[api.Condition], ctype: str, reason: str, message: str,
                    now: _dt.datetime, generation: Optional[int]) -> None:
    """Set an existing condition to False (a missing one stays missing)."""
    if any(c.type == ctype for c in conditions):
        set_condition(conditions, ctype, "False", reason, message, now, generation)
