"""The restart budget of runPolicy: how many in-place restarts an attempt's pods may do (torchrun's --max-restarts).
Pure: the render layer puts it into the pods' command line, the lifecycle computes it from the status.

One budget, runPolicy.backoffLimit, pays for every retry: gang restarts with new pods (status.restarts, less what
Kueue caused) and gang restarts inside the pods (status.inPlaceRestarts). Under InPlace an attempt may restart in
place all but the last of the retries left: the last one always recreates the pods, which is what helps when the
pod itself went bad (a GPU that keeps failing, memory a dead process still holds, a full /dev/shm).
"""

from __future__ import annotations

IN_PLACE, RECREATE = "InPlace", "Recreate"


def in_place_budget(restart_policy: str, backoff_limit: int, charged: int) -> int:
    """torchrun's --max-restarts for an attempt created after `charged` retries: the retries left, less the one
    kept for new pods; 0 under Recreate (torchrun then never restarts in place: a worker failure ends the pod)."""
    if restart_policy != IN_PLACE:
        return 0
    return max(0, backoff_limit - charged - 1)


def local_in_place_budget(restart_policy: str, backoff_limit: int) -> int:
    """torchrun's --max-restarts for `grpojob run --local`: there are no pods to recreate on one machine, so under
    InPlace every retry of backoffLimit restarts the workers in place (each resumes from the latest checkpoint);
    under Recreate none does (a failed run ends, and running it again resumes)."""
    return backoff_limit if restart_policy == IN_PLACE else 0
