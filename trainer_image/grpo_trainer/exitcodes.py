"""Exit codes at work in the trainer: TrainerError (a code and a one-line message) and the classification of
exceptions. The codes and the retry rule (0 success, 1-127 permanent, >=128 retryable) are the operator↔trainer
contract: contract.py. See docs/trainer.md.
"""

from __future__ import annotations

import errno
import os

# The codes themselves are the operator↔trainer contract (contract.py); re-exported here for the trainer's modules.
from .contract import (  # noqa: F401
    ACCELERATOR_OOM,
    BATCH,
    CHECKPOINT,
    CONFIG,
    DATASET,
    DISTRIBUTED,
    HUB_DENIED,
    HUB_NOT_FOUND,
    INTERNAL,
    MODEL,
    OK,
    PERMANENT,
    PREEMPTED,
    REMOTE_CODE,
    RETRYABLE,
    REWARD,
    SIGNAL_BASE,
    STORAGE,
    TRANSIENT_IO,
    is_retryable,
)


def from_returncode(returncode: int) -> int:
    """A worker's Popen-style return code (negative = killed by signal N) as a shell exit code."""
    if returncode < 0:
        return SIGNAL_BASE + (-returncode)
    return returncode


class TrainerError(Exception):
    """A failure with a known exit code and a one-line message that tells the user the fix."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def line(self) -> str:
        kind = PERMANENT.get(self.code) or RETRYABLE.get(self.code) or "error"
        return f"grpo_trainer: {kind} (exit {self.code}): {' '.join(self.message.split())}"


_BATCH_MARKERS = (
    "must be divisible by the global batch size",
    "can not be both configured at the same time",
    "must be divisible by the number of generations",
    "must be divisible by num_generations",
    "at least 2 generations per prompt",
    "must divide world size",
    "auto_find_batch_size",
)


def is_trl_batch_error(exc: BaseException) -> bool:
    """True for the ValueErrors TRL's GRPOConfig/GRPOTrainer raise for the batch arithmetic (E0-E6)."""
    return isinstance(exc, (ValueError, ZeroDivisionError)) and (
        isinstance(exc, ZeroDivisionError) or any(m in str(exc) for m in _BATCH_MARKERS)
    )


_DISTRIBUTED_MARKERS = (
    "gloo",
    "nccl",
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out",
    "timeout",
    "socket",
)


def classify(exc: BaseException) -> TrainerError | None:
    """Map an exception raised during training to a retryable TrainerError, or None if it is unknown."""
    if isinstance(exc, TrainerError):
        return exc
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is always there in the image
        torch = None
    if torch is not None:
        if isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
            return TrainerError(ACCELERATOR_OOM, f"out of memory on the accelerator: {exc}".splitlines()[0])
        dist_errors = tuple(
            t for t in (getattr(torch.distributed, n, None) for n in ("DistError", "DistBackendError",
                                                                      "DistNetworkError", "DistStoreError"))
            if isinstance(t, type)
        )
        if dist_errors and isinstance(exc, dist_errors):
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return TrainerError(DISTRIBUTED, f"distributed failure: {first_line}")
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        if any(m in text for m in _DISTRIBUTED_MARKERS):
            return TrainerError(DISTRIBUTED, f"distributed failure: {str(exc).splitlines()[0]}")
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        return storage_error(exc)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return TrainerError(TRANSIENT_IO, f"{type(exc).__name__}: {exc}")
    return None


_STORAGE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def storage_error(exc: OSError, path: str | None = None) -> TrainerError:
    """A permission/read-only/full-volume error as the one-line storage error, naming the path and the fix."""
    where = path or exc.filename or "the output directory"
    ids = f"uid {os.getuid()}, gid {os.getgid()}" if hasattr(os, "getuid") else "this user"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space on the volume or give spec.output a larger one"
    elif exc.errno == errno.EROFS:
        fix = "mount a writable volume at spec.output.path"
    else:
        fix = (f"make it writable by the trainer ({ids}): a volume whose driver applies the pod's fsGroup, or "
               "chown/chmod the hostPath or NFS export to that group")
    return TrainerError(STORAGE, f"cannot write {where}: {exc.strerror or exc}; {fix}")


def write_termination_message(line: str) -> None:
    """Kubernetes shows /dev/termination-log in the pod status; the operator copies it into the job's condition."""
    path = os.environ.get("GRPO_TERMINATION_LOG", "/dev/termination-log")
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:
        pass
