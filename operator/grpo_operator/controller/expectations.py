"""What the operator expects to see in the watch but may not see yet (client-go's "expectations").

  * pods it created a moment ago: until the watch shows them (or expectation_ttl passes) they count as present, as
    synthetic PodInfos, so that a second pass does not create them again;
  * objects with its pods' names owned by something else, found when a create conflicted: they count as foreign
    pods for a minute, so that the lifecycle reports the conflict.
Deletes it sent are not sent again within a window either: that is ratelimit.py, used by writer.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .. import lifecycle
from ..render import initializer, manifests

Key = tuple[str, str]  # (namespace, job name)
FOREIGN_TTL = 60.0


class Expectations:
    def __init__(self, ttl: float):
        self.ttl = ttl  # how long a created pod may be missing from the watch
        self._created: dict[Key, dict[str, tuple[int, float]]] = {}  # pod name -> (attempt, monotonic time)
        self._foreign: dict[Key, dict[str, tuple[lifecycle.PodInfo, float]]] = {}

    def created(self, key: Key, pod_names: Iterable[str], attempt: int) -> None:
        expected = self._created.setdefault(key, {})
        t = time.monotonic()
        for name in pod_names:
            expected[name] = (attempt, t)

    def refused(self, key: Key, name: str) -> None:
        """A create the API server refused: the pod will not appear; the next pass creates it again."""
        self._created.get(key, {}).pop(name, None)

    def foreign(self, key: Key, name: str, info: lifecycle.PodInfo) -> None:
        self._foreign.setdefault(key, {})[name] = (info, time.monotonic())

    def observed(self, key: Key, pods: list[lifecycle.PodInfo], job_uid: str) -> list[lifecycle.PodInfo]:
        """The watched pods of a job plus the ones expected but not seen yet, and the foreign objects noted."""
        pods = list(pods)
        now = time.monotonic()
        seen = {p.name: p for p in pods}
        expected = self._created.get(key, {})
        for name, (attempt, t) in list(expected.items()):
            p = seen.get(name)
            # the download pod is one per job: seen at all is seen (its annotation carries no attempt)
            if (p is not None and (p.attempt >= attempt or p.role == lifecycle.ROLE_INITIALIZER)) \
                    or now - t > self.ttl:
                del expected[name]
            elif p is None:
                role = _role(key[1], name)
                pods.append(lifecycle.PodInfo(name=name, attempt=attempt, owner_uid=job_uid, role=role, synthetic=True))
        foreign = self._foreign.get(key, {})
        for name, (info, t) in list(foreign.items()):
            if now - t > FOREIGN_TTL or name in seen:
                del foreign[name]
            else:
                pods.append(info)
        return pods

    def forget(self, key: Key) -> None:
        self._created.pop(key, None)
        self._foreign.pop(key, None)


def _role(job: str, pod: str) -> str:
    if pod == initializer.pod_name(job):
        return lifecycle.ROLE_INITIALIZER
    return lifecycle.ROLE_VLLM if pod == manifests.names(job).vllm_pod(0) else lifecycle.ROLE_TRAINER
