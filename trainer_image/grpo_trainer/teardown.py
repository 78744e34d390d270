"""Ends a finished run without hanging: release the DDP model, destroy the process group under a watchdog, _exit."""

from __future__ import annotations

import gc
import os
import sys
import threading

DEFAULT_TIMEOUT_S = 60.0


def finish(trainer=None, code: int = 0, timeout_s: float | None = None, exit_process: bool = True) -> None:
    """Never returns (with `exit_process=False`: returns once the teardown is done; the watchdog still exits).
    After training finished and the model was saved, a hang here must not keep the job running.

    torch 2.13 gloo sometimes deadlocks or aborts ("terminate called without an active exception") while tearing
    down; dropping the DDP-wrapped model and collecting garbage before destroy_process_group() avoids it, and a
    watchdog thread os._exit()s with `code` if teardown still takes longer than GRPO_TEARDOWN_TIMEOUT seconds.
    The interpreter's own shutdown is skipped (os._exit) for the same reason: nothing is left to do there.
    """
    if timeout_s is None:
        timeout_s = float(os.environ.get("GRPO_TEARDOWN_TIMEOUT", DEFAULT_TIMEOUT_S))

    def _flush_and_exit():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

    def _expire():
        sys.stderr.write(f"grpo_trainer: teardown did not finish in {timeout_s:.0f}s after training; "
                         f"exiting {code} anyway\n")
        _flush_and_exit()

    watchdog = threading.Timer(timeout_s, _expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        if trainer is not None:
            trainer.model_wrapped = None
            trainer.model = None
            if getattr(trainer, "accelerator", None) is not None:
                trainer.accelerator.free_memory()
        del trainer
        gc.collect()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:
        sys.stderr.write(f"grpo_trainer: ignoring an error during teardown: {type(e).__name__}: {e}\n")
    if exit_process:
        _flush_and_exit()
    watchdog.cancel()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
