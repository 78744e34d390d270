"""The client's exceptions: one base class, each also an instance of the builtin a caller would expect
(LookupError for a missing job, ValueError for a bad spec, RuntimeError for a failed job, TimeoutError)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Optional


class GRPOClientError(Exception):
    """Base of every error the client raises on purpose. str(e) is one line meant for a person."""


class ConfigError(GRPOClientError):
    """No usable kube-config / in-cluster credentials, or an unknown context."""


class ApiError(GRPOClientError):
    """The API server refused or failed a request (status: the HTTP status, 0 when it could not be reached)."""

    def __init__(self, message: str, status: int = 0, reason: str = ""):
        super().__init__(message)
        self.status = status
        self.reason = reason


class JobNotFound(ApiError, LookupError):
    def __init__(self, namespace: str, name: str):
        super().__init__(f"grpojob {namespace}/{name} not found", 404, "NotFound")
        self.namespace, self.name = namespace, name


class JobExists(ApiError):
    def __init__(self, namespace: str, name: str):
        super().__init__(f"grpojob {namespace}/{name} already exists", 409, "AlreadyExists")
        self.namespace, self.name = namespace, name


class InvalidJob(GRPOClientError, ValueError):
    """The spec was refused: locally by the webhook's own validator (nothing was sent), or by the server.

    errors: [(field, message)], e.g. [("spec.training.numGenerations", "… Valid numGenerations: 2, 4, 8 …")]."""

    def __init__(self, errors: Sequence[tuple[str, str]], source: str = "", *, server: bool = False):
        self.errors = [(str(f), str(m)) for f, m in errors]
        self.source = source
        self.server = server
        where = f"{source}: " if source else ""
        text = "; ".join(f"{f}: {m}" if f else m for f, m in self.errors) or "invalid GRPOJob"
        super().__init__(f"{where}{text}")


class LogsUnavailable(GRPOClientError):
    """No log to read: the pod of that rank does not exist (yet / any more) or has not started."""


class UnreachableStatus(GRPOClientError, RuntimeError):
    """wait_for_job_status: the job ended (or was deleted) in a state that is not one of those waited for."""

    def __init__(self, message: str, job: Optional[Any] = None):
        super().__init__(message)
        self.job = job


class JobFailed(UnreachableStatus):
    """wait_for_job_status: the job Failed (or was Rejected) and that was not what was waited for."""


class WaitTimeout(GRPOClientError, TimeoutError):
    def __init__(self, message: str, job: Optional[Any] = None):
        super().__init__(message)
        self.job = job


def one_line(text: str, limit: int = 1000) -> str:
    return " ".join(text.split())[:limit]


def api_error(exc: Exception, what: str) -> ApiError:
    """An ApiException (or a connection error) → ApiError with the server's own message, on one line."""
    status = getattr(exc, "status", 0) or 0
    if not isinstance(status, int) or not status:
        detail = one_line(str(exc), 300) or type(exc).__name__
        return ApiError(f"{what}: cannot reach the API server: {detail}", 0, "Unreachable")
    body = getattr(exc, "body", None)
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    message, reason = "", str(getattr(exc, "reason", "") or "")
    if isinstance(body, str) and body.strip():
        try:
            doc = json.loads(body)
            message, reason = str(doc.get("message") or ""), str(doc.get("reason") or reason)
        except (ValueError, AttributeError):
            message = body
    return ApiError(f"{what}: {one_line(message or reason) or 'HTTP ' + str(status)} (HTTP {status})", status, reason)
