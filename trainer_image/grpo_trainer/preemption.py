"""SIGTERM handling: every rank agrees (all-reduce) to save a checkpoint at the end of the current step and stop."""

from __future__ import annotations

import signal

from transformers import TrainerCallback


class PreemptionCallback(TrainerCallback):
    """Installs a SIGTERM handler; after a step in which any rank got SIGTERM, all ranks save and stop together."""

    def __init__(self):
        self.requested = False  # this rank received SIGTERM
        self.stopped = False  # training was stopped because of it (the entrypoint then exits 143)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def _any_rank_requested(self, args) -> bool:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.requested
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32, device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_rank_requested(args):
            self.stopped = True
            control.should_save = state.global_step > 0
            control.should_training_stop = True
        return control
