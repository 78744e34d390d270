"""Entrypoint `python -m grpo_trainer --config FILE`: runs the job and maps every outcome to the exit-code contract."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

# HF_UPDATE_DOWNLOAD_COUNTS: datasets' own switch for the HEAD it sends to s3.amazonaws.com at every load_dataset of a
# packaged builder (json, csv, parquet); it ignores HF_HUB_DISABLE_TELEMETRY. Set before datasets is imported.
OFFLINE_SAFE_DEFAULTS = {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_UPDATE_DOWNLOAD_COUNTS": "0",
                         "TOKENIZERS_PARALLELISM": "false"}


def _default_threads() -> None:
    """OMP_NUM_THREADS: torchrun sets 1 only when nproc > 1; otherwise share this machine's CPUs between local ranks."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    os.environ["OMP_NUM_THREADS"] = str(max(1, cpus // local))


def main(argv: list[str] | None = None) -> int:
    """Run the job; after training, end the process (teardown.finish) with its code."""
    return _main(argv, exit_process=True)


def run_worker(argv: list[str]) -> int:
    """main() for a worker that torchrun started as a function (grpo_trainer/launch.py): the same run and teardown,
    without the final os._exit, which would hide from the agent that the worker finished."""
    return _main(argv, exit_process=False)


def _main(argv: list[str] | None, exit_process: bool) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_trainer", description=__doc__)
    parser.add_argument("--config", required=True, help="the trainer config JSON (docs/trainer-config.md)")
    ns = parser.parse_args(argv)
    for key, value in OFFLINE_SAFE_DEFAULTS.items():
        os.environ.setdefault(key, value)
    _default_threads()

    from .exitcodes import INTERNAL, TrainerError, classify

    trainer = None
    try:
        from . import config, preemption, train

        preemption.install()

        cfg = config.load(ns.config)
        code, trainer = train.run(cfg)
    except TrainerError as e:
        return _fail(e)
    except KeyboardInterrupt:
        return _fail(TrainerError(130, "interrupted"))
    except BaseException as e:
        known = classify(e)
        if known is not None:
            return _fail(known)
        traceback.print_exc()
        return _fail(TrainerError(INTERNAL, f"unexpected {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    from .teardown import finish

    finish(trainer, code, exit_process=exit_process)  # with exit_process, never returns
    return code


def _fail(err) -> int:
    from .exitcodes import write_termination_message

    line = err.line()
    # Every rank prints its own line: under torchrun the agent may SIGKILL the others once one rank has failed.
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    write_termination_message(line)
    return err.code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown after failures too: a half-initialised gloo group can hang in its destructor.
    os._exit(code)
