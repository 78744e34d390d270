"""SIGTERM handling: record the signal; every rank agrees (all-reduce) to save at the end of the step and stop."""

from __future__ import annotations

import signal

from transformers import TrainerCallback

_requested = False


def _handle(signum, frame):
    global _requested
    _requested = True


def install() -> None:
    """From the first moment on, SIGTERM only records the request: setup still ends with its own exit code (a
    permanent error keeps its message), and training saves a checkpoint before it stops."""
    signal.signal(signal.SIGTERM, _handle)


def requested() -> bool:
    return _requested


class PreemptionCallback(TrainerCallback):
    """After a step in which any rank got SIGTERM, all ranks save a checkpoint together and stop training."""

    def __init__(self):
        self.stopped = False  # training was stopped because of SIGTERM (the entrypoint then exits 143)

    def _any_rank_requested(self, args) -> bool:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return _requested
        flag = torch.tensor([1 if _requested else 0], dtype=torch.int32, device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_rank_requested(args):
            self.stopped = True
            control.should_save = state.global_step > 0
            control.should_training_stop = True
        return control
