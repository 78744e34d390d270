"""The exit-code contract: ranges, exception classification, the torchrun wrapper's mapping, teardown watchdog."""

import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

from grpo_trainer import exitcodes as ec
from grpo_trainer.launch import exit_code_for
from tests.support.trainer import REPO, env


def test_permanent_codes_are_1_to_127_and_retryable_128_plus():
    for code in ec.PERMANENT:
        assert 1 <= code <= 127 and not ec.is_retryable(code)
    for code in ec.RETRYABLE:
        assert 128 <= code <= 255 and ec.is_retryable(code)
    assert ec.PREEMPTED == 143 and ec.from_returncode(-9) == 137 and ec.from_returncode(13) == 13
    assert len(set(ec.PERMANENT) | set(ec.RETRYABLE)) == len(ec.PERMANENT) + len(ec.RETRYABLE)


@pytest.mark.parametrize("exc, code", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"), ec.ACCELERATOR_OOM),
    (torch.distributed.DistBackendError("NCCL communicator was aborted"), ec.DISTRIBUTED),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"), ec.DISTRIBUTED),
    (RuntimeError("Timed out waiting 1800000ms for recv operation to complete"), ec.DISTRIBUTED),
    (ConnectionError("hub unreachable"), ec.TRANSIENT_IO),
    (ValueError("a bug"), None),
])
def test_classify(exc, code):
    got = ec.classify(exc)
    assert (got.code if got else None) == code


def test_trl_batch_errors_recognised():
    assert ec.is_trl_batch_error(ValueError("generation_batch_size (2) must be divisible by num_generations (4).")
                                 )
    assert ec.is_trl_batch_error(ZeroDivisionError("integer division or modulo by zero"))
    assert not ec.is_trl_batch_error(ValueError("learning_rate must be positive"))


def failure(rank_exit: dict) -> ChildFailedError:
    return ChildFailedError("grpo_trainer", {r: ProcessFailure(local_rank=r, pid=1000 + r, exitcode=c, error_file="")
                                             for r, c in rank_exit.items()})


@pytest.mark.parametrize("exits, code", [
    ({0: 13, 1: 13}, 13),                 # TRL batch error on every rank
    ({0: -15, 1: 11}, 11),                # a permanent code wins over the agent's SIGTERM of the others
    ({0: 200, 1: -9}, 200),               # all retryable: the first (tie -> lowest rank)
    ({1: -9}, 137),                       # OOM killer
    ({0: 143}, 143),                      # preempted, checkpoint saved
])
def test_launcher_maps_worker_failures(exits, code):
    assert exit_code_for(failure(exits)) == code


def test_launcher_maps_agent_signal_and_rendezvous_failure():
    import signal

    assert exit_code_for(SignalException("agent got SIGTERM", signal.SIGTERM)) == 143
    assert exit_code_for(RendezvousTimeoutError("peers never came")) == ec.DISTRIBUTED
    assert exit_code_for(KeyError("x")) is None


def test_trainer_error_line_is_one_line():
    line = ec.TrainerError(ec.DATASET, "no column 'q'\n  columns: a, b").line()
    assert line == "grpo_trainer: dataset error (exit 11): no column 'q' columns: a, b"


HANG = textwrap.dedent("""
    import sys, time, torch.distributed as dist
    dist.is_initialized = lambda: True
    def hang():
        print("tearing down", flush=True)
        time.sleep(120)
    dist.destroy_process_group = hang
    from grpo_trainer.teardown import finish
    finish(None, int(sys.argv[1]), timeout_s=1.0)
""")


@pytest.mark.parametrize("code", [0, 143])
def test_teardown_watchdog_exits_when_destroy_process_group_hangs(code):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", HANG, str(code)], cwd=REPO, env=env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == code, p.stderr
    assert "tearing down" in p.stdout and "teardown did not finish in 1s" in p.stderr
    assert time.monotonic() - t0 < 30


def test_cli_errors_are_one_line_without_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "grpo_trainer", "--config", str(tmp_path / "nope.json")], cwd=REPO,
                       env=env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == ec.CONFIG
    assert p.stderr.strip().splitlines() == [f"grpo_trainer: config error (exit 10): cannot read the config file "
                                             f"{tmp_path / 'nope.json'}: No such file or directory"]
