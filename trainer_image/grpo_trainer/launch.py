"""`python -m grpo_trainer.launch ARGS` is torchrun with the same ARGS, but it exits with the workers' contract code.

Plain torchrun exits 1 whenever any worker fails, which the operator would read as permanent. This wrapper runs
torchrun's own launcher in-process and maps the outcome: a permanent worker code (1-127) if any worker had one,
else the first failed worker's code (a signal N becomes 128+N), 128+N when the agent itself got signal N (pod
deletion: 143), and 200 when rendezvous fails (peers never arrived or the c10d store was lost).

In-place restarts (`--max-restarts=N`, runPolicy.restartPolicy InPlace): torchrun's agent restarts its workers inside
the pod after a worker failure, and every other node's agent follows into the new rendezvous round. Two hooks on the
agent: each generation of workers gets GRPO_IN_PLACE_RESTARTS (how many times this attempt's gang restarted so far;
every agent restarts for every gang restart, whether its own workers failed or another node's did, so the count is
the same on all nodes, and every agent charges it to its --max-restarts), and a permanent worker code (1-127) is never
restarted in place: rerunning fails the same way, so the agent gives up at once and the launcher exits with that
code. With --max-restarts above 0 each generation of workers gets a fresh rendezvous store (main() says why).

SIGTERM before the workers start (the wait for the store, torchrun's rendezvous) exits 143 at once: the launcher is
the container's PID 1, and the kernel ignores a signal PID 1 has no handler for, so a pod deleted then stayed for its
whole termination grace period (120 s). torchrun installs its own handler when it starts the workers (it stops them,
and they save a checkpoint).
"""

from __future__ import annotations

import io
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from .contract import C10D_PORT, IN_PLACE_RESTART_PREFIX, IN_PLACE_RESTARTS_ENV, WORKER_NAME_PREFIX
from .exitcodes import DISTRIBUTED, SIGNAL_BASE, from_returncode, is_retryable

DEFAULT_JOIN_TIMEOUT = 600  # torchrun's own default for c10d's join_timeout


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


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")


def wait_for_store(endpoint: str, timeout: float, *, connect_timeout: float = 2.0, interval: float = 1.0,
                   is_host: Callable[[str], bool] | None = None, resolve=socket.getaddrinfo,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                   say: Callable[[str], None] | None = None) -> str:
    """Wait until the c10d store's host name leads to this agent (it hosts the store) or to a store that accepts a
    connection; "host", "reachable" or "timeout" (then torchrun goes on and fails as it would have).

    Why: after a gang restart the new pods keep their host names but get new IPs, and the cluster DNS serves the old
    pod's address until its endpoints catch up (CoreDNS caches too). torch resolves the name once per connect and a
    connect to a vanished pod IP hangs for the whole read timeout (60 s) — rendezvous then failed and the gang
    restarted again (seen on a real node). Here every try re-resolves, and a connect gives up after
    `connect_timeout`."""
    if is_host is None:
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

        is_host = _matches_machine_hostname
    if say is None:
        say = _say
    host, _, port_text = endpoint.rpartition(":")
    if not host or not port_text.isdigit():
        host, port_text = endpoint, str(C10D_PORT)
    host = host.strip("[]")
    start = clock()
    waited = False
    while True:
        if is_host(host):
            outcome = "host"
            break
        try:
            addrs = [a[4] for a in resolve(host, int(port_text), type=socket.SOCK_STREAM)]
        except (OSError, UnicodeError):
            addrs = []
        reached = False
        for addr in addrs:
            try:
                socket.create_connection(addr[:2], timeout=connect_timeout).close()
                reached = True
                break
            except OSError:
                continue
        if reached:
            outcome = "reachable"
            break
        if clock() - start >= timeout:
            outcome = "timeout"
            break
        if not waited:
            shown = ", ".join(sorted({a[0] for a in addrs})) or "no address yet"
            say(f"grpo_trainer.launch: waiting for the rendezvous store {host}:{port_text} ({shown}: not reachable yet)")
            waited = True
        sleep(interval)
    if waited:
        say(f"grpo_trainer.launch: rendezvous store {host}:{port_text}: {outcome} after {clock() - start:.1f} s")
    return outcome


def _join_timeout(rdzv_conf: str) -> float:
    for item in (rdzv_conf or "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == "join_timeout" and value.strip().isdigit():
            return float(value)
    return DEFAULT_JOIN_TIMEOUT


def install_agent_hooks(say: Callable[[str], None] | None = None) -> None:
    """Count the gang's worker generations into the workers' environment and stop in-place restarts after a
    permanent failure (the module docstring says why). Patches torchrun's agent class in this process only."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    tell = say or _say
    initialize, monitor = SimpleElasticAgent._initialize_workers, LocalElasticAgent._monitor_workers
    starts = [0]

    def _initialize_workers(self, worker_group):
        # the subprocess handler copies os.environ into each worker's environment
        os.environ[IN_PLACE_RESTARTS_ENV] = str(starts[0])
        # every gang restart is charged once on every agent: torch charges only an agent whose own workers failed (one
        # that follows another node into the new round is not), so a gang could restart up to nodes × --max-restarts
        # times; this way at most --max-restarts, the budget the operator gave the attempt
        self._remaining_restarts = worker_group.spec.max_restarts - starts[0]
        if starts[0]:
            tell(f"{IN_PLACE_RESTART_PREFIX}{starts[0]}: starting the workers again in this pod "
                 "(they resume from the latest checkpoint)")
        starts[0] += 1
        return initialize(self, worker_group)

    def _monitor_workers(self, worker_group):
        result = monitor(self, worker_group)
        if result.state == WorkerState.FAILED and self._remaining_restarts > 0:
            codes = {rank: from_returncode(f.exitcode) or 1 for rank, f in result.failures.items()}
            permanent = {rank: c for rank, c in codes.items() if not is_retryable(c)}
            if permanent:
                rank, code = min(permanent.items())
                tell(f"grpo_trainer.launch: worker rank {rank} exited with permanent code {code}: not restarted in "
                     "place")
                self._remaining_restarts = 0
        return result

    SimpleElasticAgent._initialize_workers = _initialize_workers
    LocalElasticAgent._monitor_workers = _monitor_workers


# What every worker imports before it reads its job (grpo_trainer/__main__.py): the forkserver imports it once, and
# each generation of workers starts from there (lean_imports hides what a job does not use later, in the worker).
PRELOAD = ["torch", "grpo_trainer.config", "grpo_trainer.preemption", "grpo_trainer.train"]
TRAINER_MODULE = ["-u", "-m", "grpo_trainer"]  # torchrun's command for `-m grpo_trainer ARGS`


def name_process(name: str) -> None:
    """The process's name in `ps`, `top` and /proc/PID/comm (Linux, 15 bytes at most). A forked worker's environment
    in /proc is the forkserver's, so its name is what tells its rank from outside."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def train_worker(*argv: str) -> None:
    """One worker: `python -m grpo_trainer ARGS`, forked from the forkserver (its imports done). Returns on success,
    as torchrun's function workers must (their return value tells the agent they finished); exits with the contract
    code otherwise."""
    from . import __main__ as trainer_main

    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=True)  # as `python -u`
    # the forkserver's environment is the launcher's when it started: this generation's count comes from torchrun
    os.environ[IN_PLACE_RESTARTS_ENV] = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    name_process(f"{WORKER_NAME_PREFIX}{os.environ.get('RANK', '')}")
    code = trainer_main.run_worker(list(argv))
    if code:
        sys.exit(code)


class _NoJoinTraceback(logging.Filter):
    """torchrun logs a forked worker's non-zero exit with the traceback of its own join (ProcessExitedException): the
    exit code, on the same line, is the news; a traceback in the pod's log reads like a crash of the launcher."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ == "ProcessExitedException":
            record.exc_info, record.exc_text = None, None
        return True


def _launch(args) -> None:
    """torchrun's run(args); a `-m grpo_trainer` job's workers are forked from a forkserver that imported PRELOAD once,
    so an in-place restart's workers skip the seconds of imports (docs/performance.md). torchrun's own run() does the
    rest (--standalone and all): only the entrypoint it derives from the arguments is swapped."""
    import multiprocessing

    import torch.distributed.run as torchrun

    derive = torchrun.config_from_args

    def config_from_args(a):
        config, cmd, cmd_args = derive(a)
        if cmd == sys.executable and list(cmd_args[:3]) == TRAINER_MODULE:
            multiprocessing.set_forkserver_preload(PRELOAD)
            config.start_method = "forkserver"
            return config, train_worker, list(cmd_args[3:])
        return config, cmd, cmd_args

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_NoJoinTraceback())
    torchrun.config_from_args = config_from_args
    try:
        torchrun.run(args)
    finally:
        torchrun.config_from_args = derive


def _exit_on_sigterm(signum: int, frame: object) -> None:
    os.write(2, b"grpo_trainer.launch: SIGTERM before the workers started; exit 143\n")
    os._exit(SIGNAL_BASE + signum)  # nothing to save yet; a raise could be caught inside torch's rendezvous


def start_forkserver_early(argv: list[str]) -> bool:
    """For a `-m grpo_trainer` job, start the forkserver before this process imports torch: its imports (PRELOAD) then
    overlap the launcher's own imports, the wait for the c10d store and the rendezvous, instead of following them."""
    if not any(argv[i:i + 2] == ["-m", "grpo_trainer"] for i in range(len(argv) - 1)):
        return False
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()
    return True


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    argv = sys.argv[1:] if argv is None else argv
    start_forkserver_early(argv)
    from torch.distributed.run import parse_args

    args = parse_args(argv)
    if args.rdzv_backend == "c10d" and args.rdzv_endpoint:
        wait_for_store(args.rdzv_endpoint, _join_timeout(args.rdzv_conf))
    install_agent_hooks()
    if args.max_restarts > 0:
        # torch's agents share one store server across rendezvous rounds by default, and the workers' keys in it are
        # not per round: a restarted rank could read the dead generation's gloo/NCCL address before its peer wrote the
        # new one (seen on loopback: "Connection refused", a second restart). Without sharing, each generation's global
        # rank 0 hosts a fresh store (torch's own opt-out; the job's pods reach each other on every port).
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    try:
        _launch(args)
    except BaseException as e:
        code = exit_code_for(e)
        if code is None:
            raise
        sys.stderr.write(f"grpo_trainer.launch: {describe(e)}; exit {code}\n")
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
