"""`python -m grpo_trainer.launch ARGS` is torchrun with the same ARGS, but it exits with the workers' contract code.

Plain torchrun exits 1 whenever any worker fails, which the operator would read as permanent. This wrapper runs
torchrun's own launcher in-process and maps the outcome: a permanent worker code (1-127) if any worker had one,
else the first failed worker's code (a signal N becomes 128+N), 128+N when the agent itself got signal N (pod deletion: 143), and 200 when rendezvous fails (peers never
arrived or the c10d store was lost).
"""

from __future__ import annotations

import sys

from .exitcodes import DISTRIBUTED, SIGNAL_BASE, from_returncode, is_retryable


def exit_code_for(exc: BaseException) -> int | None:
    """The contract exit code for an exception escaping torchrun's `run`, or None if it is not torchrun's."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    if isinstance(exc, ChildFailedError):
        return _worst_failure(exc)[1]
    if isinstance(exc, SignalException):
        return SIGNAL_BASE + int(exc.sigval)
    if isinstance(exc, RendezvousError):
        return DISTRIBUTED
    return None


def _worst_failure(exc) -> tuple[int, int]:
    """(rank, exit code) of the failure that decides the outcome.

    A permanent code (1-127) on any rank wins: such errors are deterministic, and the other ranks' failures
    (SIGTERM from the agent, a lost gloo/NCCL peer) are consequences. Otherwise the first failure (torchrun's
    timestamps have 1 s resolution; ties go to the lowest rank).
    """
    codes = {rank: from_returncode(f.exitcode) or 1 for rank, f in exc.failures.items()}
    permanent = [rank for rank in sorted(codes) if not is_retryable(codes[rank])]
    if permanent:
        first = min(permanent, key=lambda r: exc.failures[r].timestamp)
        return first, codes[first]
    first, _ = exc.get_first_failure()
    return first, codes[first]


def describe(exc: BaseException) -> str:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(exc, ChildFailedError):
        rank, _code = _worst_failure(exc)
        failure = exc.failures[rank]
        how = f"signal {-failure.exitcode}" if failure.exitcode < 0 else f"code {failure.exitcode}"
        return f"worker rank {rank} (local rank {failure.local_rank}) failed with {how}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except BaseException as e:  # noqa: BLE001
        code = exit_code_for(e)
        if code is None:
            raise
        sys.stderr.write(f"grpo_trainer.launch: {describe(e)}; exit {code}\n")
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
