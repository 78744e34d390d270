"""A process-tree supervisor for `grpojob run --local`: run a launcher, and stop it with every descendant.

torchrun starts each worker in a session of its own, so the launcher's process group does not reach them; a worker
may also outlive its launcher. So the tree is found through /proc (Linux) by parent PID, this process becomes a
child subreaper (orphans are re-parented to it, not to init), and stopping signals every descendant by PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Optional

TIMED_OUT = 124  # like timeout(1)
INTERRUPTED = 130  # 128 + SIGINT


def run_tree(proc: subprocess.Popen[str], timeout: Optional[float]) -> int:
    """Wait for the launcher `proc` (started by the caller after become_subreaper()); its exit code, TIMED_OUT after
    `timeout` seconds or INTERRUPTED on Ctrl-C / SIGTERM, with the whole tree stopped in every case."""
    # `kill PID` / a CI cancel (SIGTERM) stops the tree like Ctrl-C does, instead of leaving it running
    old_term = signal.signal(signal.SIGTERM, signal.default_int_handler) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        code = proc.wait(timeout=timeout)
        if any(alive(p) for p in tree(os.getpid())):  # a worker that outlived its launcher
            stop(proc, grace=0)
    except subprocess.TimeoutExpired:
        stop(proc)
        code = TIMED_OUT
    except KeyboardInterrupt:
        stop(proc, signal.SIGTERM)
        code = INTERRUPTED
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    return code


def _children() -> dict[int, list[int]]:
    """ppid → pids, from /proc (Linux)."""
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", encoding="utf-8", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(d))
    return out


def tree(root: int) -> list[int]:
    """Every descendant of `root` (not root itself)."""
    children, out, todo = _children(), [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def become_subreaper() -> None:
    """Orphans of our launcher (its workers, when it dies first) are re-parented to us, not to init, so stop() can
    still find them as our descendants."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, grace: float = 30.0) -> None:
    """Stop the launcher and its whole process tree. torchrun starts each worker in a session of its own, so the
    launcher's process group does not reach them: signal every descendant by PID (listed before anything exits),
    then SIGKILL whatever is left of the tree after the grace period - including workers the launcher orphaned."""
    descendants = tree(proc.pid)
    for pid in [*([proc.pid] if proc.poll() is None else []), *descendants]:  # a reaped launcher's PID may be reused
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + (5.0 if proc.poll() is not None else 0.0)
    while time.monotonic() < deadline and any(alive(p) for p in descendants):
        time.sleep(0.1)
    for pid in [*descendants, *tree(os.getpid())]:
        if pid != proc.pid and alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    # reap orphans re-parented to us (subreaper) so that none stays a zombie
    for pid in tree(os.getpid()):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
