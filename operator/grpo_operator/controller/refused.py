"""A create the API server refuses (quota, PodSecurity, an invalid object, a webhook's denial or failure): a `FailedCreate`
Warning Event on the job with the server's own message, at most once a minute per object, and a record the next
pass hands the lifecycle (JobView.create_refused), which makes it condition CreateFailed (lifecycle/create.py). The
reconcile retries with the work queue's backoff; a successful create drops the record. Before this a refused pod
create only left a log line and the job looked Pending.

Refusals is the writer's (writer.py): the create path (creates.py) notes refusals, the observers read the record into
the next pass's JobView."""

from __future__ import annotations

import logging
from typing import Any, Optional

from .. import lifecycle
from ..api.status import Reason
from . import kube
from .events import EventRecorder
from .ratelimit import RateLimiter
from .workqueue import Key

log = logging.getLogger("grpo_operator")

EVENT_WINDOW = 60.0  # seconds between two FailedCreate events of one object
MESSAGE_LIMIT = 1024  # characters of the server's message kept (an Event's and a condition's message)


def refused(exc: kube.ApiError) -> bool:
    """A refusal (the request itself is wrong or not allowed, or the server failed it: a failing third-party admission
    webhook is a 500), not a conflict or a throttle. A 5xx may pass on its own: the condition clears once a create
    goes through."""
    return exc.status >= 500 or (400 <= exc.status < 500 and exc.status not in (401, 408, 409, 429))


class Refusals:
    """Per job, the last refused create's message until a create succeeds; one FailedCreate Event per object per
    EVENT_WINDOW."""

    def __init__(self, events: EventRecorder):
        self.events = events
        self.records: dict[Key, str] = {}
        self.event_limit = RateLimiter(EVENT_WINDOW)

    def get(self, key: Key) -> Optional[str]:
        return self.records.get(key)

    def __contains__(self, key: Key) -> bool:
        return key in self.records

    def forget(self, key: Key) -> None:
        """The job is gone, or everything was created (the next pass clears CreateFailed)."""
        self.records.pop(key, None)

    def report(self, key: Key, obj: dict[str, Any], exc: kube.ApiError, job: Optional[dict[str, Any]]) -> None:
        """A create the server answered with an error: noted when the error is a refusal."""
        if job is None or not refused(exc):
            return
        kind, name = obj["kind"], obj["metadata"]["name"]
        self.note(key, name, f"Error creating {kind} {name}: {exc.status} {exc.reason}: {exc.message}", job)

    def note(self, key: Key, name: str, message: str, job: dict[str, Any]) -> None:
        """Record a refusal of object `name` (the condition's message) and send its Event (rate-limited per object)."""
        log.warning("%s/%s: %s", key[0], key[1], message)
        self.records[key] = message[:MESSAGE_LIMIT]
        if self.event_limit.allow((key[0], name)):
            self.events.record(job, lifecycle.JobEvent("Warning", Reason.FAILED_CREATE, message[:MESSAGE_LIMIT]))
