"""The trainer's exit-code contract: 0 success, 1-127 permanent (do not retry), >=128 retryable.

The operator's rule is exactly that: a pod that ends with 1-127 fails the job, one that ends with 128 or
more (or is killed by a signal) is restarted and resumes from the latest checkpoint. See docs/trainer.md.
"""

from __future__ import annotations

import errno
import os

OK = 0

# Permanent (1-127): rerunning the same spec fails the same way.
INTERNAL = 1  # an unexpected exception in the trainer (a bug): traceback on stderr
CONFIG = 10  # the config JSON is unreadable, misses a key, or a GRPOConfig argument is invalid
DATASET = 11  # the dataset cannot be loaded, or the prompt/answer column does not exist
REWARD = 12  # unknown built-in reward, or a custom reward that cannot be imported
BATCH = 13  # TRL's batch arithmetic rejected the spec at this world size (TRL's own message)
MODEL = 14  # the model or tokenizer cannot be loaded (no such path/repo, bad files)
CHECKPOINT = 15  # the checkpoint to resume from exists but cannot be loaded
STORAGE = 16  # the output directory cannot be written (permissions, read-only or full volume)

# Retryable (>=128). 128+N is "killed by signal N" (143 = SIGTERM, 137 = SIGKILL e.g. the OOM killer).
SIGNAL_BASE = 128
PREEMPTED = 128 + 15  # SIGTERM received: a checkpoint was saved when possible, then exit 143
DISTRIBUTED = 200  # gloo/NCCL timeout or a lost peer; rendezvous failure (peers never arrived)
ACCELERATOR_OOM = 201  # CUDA out of memory (torch.OutOfMemoryError)
TRANSIENT_IO = 202  # the model/dataset hub or a network file system was unreachable

PERMANENT = {
    INTERNAL: "internal error",
    CONFIG: "config error",
    DATASET: "dataset error",
    REWARD: "reward error",
    BATCH: "batch size error",
    MODEL: "model error",
    CHECKPOINT: "checkpoint error",
    STORAGE: "storage error",
}
RETRYABLE = {
    PREEMPTED: "preempted (SIGTERM)",
    DISTRIBUTED: "distributed communication failure",
    ACCELERATOR_OOM: "accelerator out of memory",
    TRANSIENT_IO: "transient I/O failure",
}


def is_retryable(code: int) -> bool:
    """The operator's rule: 0 is success, 1-127 permanent, 128-255 (and any signal) retryable."""
    return code >= SIGNAL_BASE or code < 0


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
            return TrainerError(DISTRIBUTED, f"distributed failure: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
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
