"""What each training process is doing, published so a hang can be seen and diagnosed: its phase (loading, generating,
rewards, training, saving, weight-sync, evaluating, done) with the time it entered it, per-phase cumulative seconds,
and a heartbeat a thread ticks while the interpreter runs; and its stacks on demand (faulthandler on a signal).

Every process writes its record as JSON into the node's beat directory (one file per global rank, replaced atomically
every HEARTBEAT_SECONDS); the node's metrics server (metrics.py, local rank 0) reads them all at each scrape, so the
operator sees every rank through one endpoint per pod. A POST on STACKS_PATH signals every live process of the pod;
faulthandler writes their threads' stacks at C level, even while Python code is blocked (a hung collective, a reward
function that never returns), into <output>/stalls/attempt-N/rank-R.txt. A stopped (SIGSTOP) or frozen process runs
no handler: its file stays empty and its peers' stacks tell where they wait for it. docs/operator.md "Stalls"."""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

from . import contract as C

BEAT_SUFFIX = ".beat.json"


def beat_dir() -> str:
    """The node's beat directory: GRPO_BEAT_DIR, else one per torchrun agent (the local processes' common parent), so
    two runs on one machine never read each other's records."""
    return os.environ.get(C.BEAT_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"grpo-beats-{os.getppid()}")


def stacks_path(output_dir: str, attempt: str, rank: int) -> str:
    return os.path.join(output_dir, C.STALLS_DIR, f"attempt-{attempt or 0}", f"rank-{rank}.txt")


class PhaseClock:
    """One per process: a stack of phases (a weight sync inside generation returns to generation), the seconds spent
    in each (the innermost phase counts), the current step, and the heartbeat thread that publishes them."""

    def __init__(self, rank: int, *, directory: Optional[str] = None, stacks: str = "",
                 interval: float = C.HEARTBEAT_SECONDS, clock: Callable[[], float] = time.time,
                 downloaded: Optional[Callable[[], Optional[int]]] = None):
        self.rank, self.directory, self.stacks, self.interval, self.clock = rank, directory, stacks, interval, clock
        self.downloaded = downloaded  # bytes fetched so far, asked only while loading
        self.lock = threading.Lock()
        now = clock()
        self.stack: list[tuple[str, float]] = [(C.PHASE_LOADING, now)]
        self.totals: dict[str, float] = {}
        self.counted_from = now
        self.step = 0
        self.began: Optional[int] = None  # the step training began at in this process (a resume's checkpoint step)
        self.beat = now
        self._stop = threading.Event()

    @property
    def phase(self) -> str:
        return self.stack[-1][0]

    def _account(self, now: float) -> None:
        top = self.phase
        self.totals[top] = self.totals.get(top, 0.0) + max(now - self.counted_from, 0.0)
        self.counted_from = now

    def set(self, phase: str) -> None:
        """Replace the outermost phase (loading → training → saving → done)."""
        with self.lock:
            now = self.clock()
            self._account(now)
            self.stack = [(phase, now)]

    @contextmanager
    def within(self, phase: str) -> Iterator[None]:
        """`phase` while the block runs, then back to the enclosing one (its entry time restarts: it resumed now)."""
        with self.lock:
            now = self.clock()
            self._account(now)
            self.stack.append((phase, now))
        try:
            yield
        finally:
            with self.lock:
                now = self.clock()
                self._account(now)
                if len(self.stack) > 1:
                    self.stack.pop()
                    self.stack[-1] = (self.stack[-1][0], now)

    def record(self) -> dict[str, Any]:
        with self.lock:
            now = self.clock()
            totals = dict(self.totals)
            totals[self.phase] = totals.get(self.phase, 0.0) + max(now - self.counted_from, 0.0)
            rec = {"rank": self.rank, "pid": os.getpid(), "phase": self.phase, "since": round(self.stack[-1][1], 3),
                   "heartbeat": round(now, 3), "step": self.step, "stacks": self.stacks,
                   "seconds": {k: round(v, 3) for k, v in sorted(totals.items())}}
            if self.began is not None:
                rec["began_step"] = self.began
        if rec["phase"] == C.PHASE_LOADING and self.downloaded is not None:  # outside the lock: it reads the disk
            fetched = self.downloaded()
            if fetched is not None:
                rec["download_bytes"] = fetched
        return rec

    # ------------------------------------------------------------------ publishing
    def publish(self) -> None:
        if not self.directory:
            return
        path = os.path.join(self.directory, f"rank-{self.rank}{BEAT_SUFFIX}")
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.record(), f, separators=(",", ":"))
            os.replace(tmp, path)
        except OSError:
            pass  # a full /tmp must not stop training; the operator then sees a frozen heartbeat

    def start(self) -> PhaseClock:
        def tick() -> None:
            while not self._stop.is_set():
                self.publish()
                self._stop.wait(self.interval)

        self.publish()  # the record exists when start() returns, however late the thread first runs
        threading.Thread(target=tick, name="grpo-heartbeat", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.publish()


def hub_cache() -> str:
    """Where huggingface_hub downloads to (its own resolution order, without importing it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(home, "hub")


def _on_hub(ref: Optional[str]) -> bool:
    """A Hub id, not a path in the pod: grpo_trainer.stage.is_local's rule (a Hub id is at most namespace/name)."""
    return bool(ref) and not str(ref).startswith(("/", "./", "../", "~")) and str(ref).count("/") <= 1 \
        and not os.path.exists(str(ref))


def hub_folders(*models: Optional[str], datasets: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The Hub cache folders of the job's own repos (models--org--name, datasets--org--name); local paths have none."""
    return tuple([f"models--{str(m).replace('/', '--')}" for m in models if _on_hub(m)]
                 + [f"datasets--{d.replace('/', '--')}" for d in datasets if _on_hub(d)])


def downloaded_bytes(cache: str, folders: Optional[tuple[str, ...]] = None) -> Optional[int]:
    """The bytes in the blob folders of the job's repos in the Hub cache (every repo when `folders` is None; partial
    downloads included: they grow in place); None when there is no cache. The job's repos only: the heartbeat thread
    runs this, and a shared cache of hundreds of repos on a network volume must not slow its ticks."""
    total = 0
    try:
        repos = [e.path for e in os.scandir(cache) if e.is_dir() and "--" in e.name
                 and (folders is None or e.name in folders)]
    except OSError:
        return None
    for repo in repos:
        try:
            blobs = list(os.scandir(os.path.join(repo, "blobs")))
        except OSError:
            continue
        for b in blobs:
            try:
                total += b.stat().st_size
            except OSError:
                pass  # a partial file renamed under us: counted at the next tick
    return total


def read_beats(directory: str) -> list[dict[str, Any]]:
    """The beat records of the node's processes still alive (a record whose process is gone is skipped)."""
    out = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(BEAT_SUFFIX))
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("pid"), int) and _alive(rec["pid"]):
            out.append(rec)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------- stacks
def register_stacks(path: str) -> bool:
    """All threads' stacks into `path` (appended) on STACKS_SIGNAL; False when the file cannot be opened."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        f = open(path, "a", encoding="utf-8")  # kept open: faulthandler writes to its descriptor
    except OSError:
        return False
    faulthandler.register(getattr(signal, C.STACKS_SIGNAL_NAME), file=f, all_threads=True, chain=False)
    _OPEN.append(f)
    return True


_OPEN: list[Any] = []


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def dump_all(directory: str, timeout: float = 3.0) -> dict[str, dict[str, Any]]:
    """Signal every live process of the node to dump its stacks; wait (up to `timeout`) for each file to grow and
    settle; answer per rank: the file, whether it was written, and the new text (a stopped process writes nothing)."""
    beats = [b for b in read_beats(directory) if b.get("stacks")]
    before = {b["rank"]: _size(b["stacks"]) for b in beats}
    for b in beats:
        try:
            os.kill(b["pid"], getattr(signal, C.STACKS_SIGNAL_NAME))
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    sizes = dict(before)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = {r: _size(b["stacks"]) for r, b in ((b["rank"], b) for b in beats)}
        settled = now == sizes and all(now[r] > before[r] for r in now)
        sizes = now
        if settled:
            break
    out = {}
    for b in beats:
        r = b["rank"]
        text = ""
        if sizes[r] > before[r] >= 0 or (before[r] < 0 < sizes[r]):
            with open(b["stacks"], encoding="utf-8", errors="replace") as f:
                f.seek(max(before[r], 0))
                text = f.read(64 * 1024)
        out[str(r)] = {"file": b["stacks"], "dumped": bool(text), "phase": b.get("phase"), "stack": text}
    return out


# ---------------------------------------------------------------------------------------------- hooks
def wrap(obj: Any, name: str, clock: PhaseClock, phase: str) -> bool:
    """Run obj.name inside `phase` (an instance attribute shadowing the method); False when there is none."""
    fn = getattr(obj, name, None)
    if not callable(fn) or getattr(fn, "_grpo_phase", None):
        return False

    @functools.wraps(fn)
    def call(*a: Any, **kw: Any) -> Any:
        with clock.within(phase):
            return fn(*a, **kw)

    call._grpo_phase = phase  # type: ignore[attr-defined]
    setattr(obj, name, call)
    return True


# TRL 1.16 GRPOTrainer's entry points that no callback brackets
TRAINER_HOOKS = (("_generate", C.PHASE_GENERATING), ("_calculate_rewards", C.PHASE_REWARDS),
                 ("_save_checkpoint", C.PHASE_SAVING), ("evaluate", C.PHASE_EVALUATING))


def instrument(trainer: Any, clock: PhaseClock) -> list[str]:
    """Wrap the trainer's generation, reward, save and evaluation entry points, and the vLLM weight sync; the
    names wrapped (a TRL without one of them simply reports the enclosing phase)."""
    done = [name for name, phase in TRAINER_HOOKS if wrap(trainer, name, clock, phase)]
    generation = getattr(trainer, "vllm_generation", None)
    if generation is not None and wrap(generation, "sync_weights", clock, C.PHASE_WEIGHT_SYNC):
        done.append("vllm_generation.sync_weights")
    return done


def callback(clock: PhaseClock) -> Any:
    """The TrainerCallback that moves the outer phase: training from the first step, the step count, done at the end."""
    from transformers import TrainerCallback

    class PhaseCallback(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.step = clock.began = state.global_step  # a step past `began` is one this process trained
            clock.set(C.PHASE_TRAINING)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.step = state.global_step

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.step = state.global_step
            clock.set(C.PHASE_SAVING)  # the final save_model follows train()

    return PhaseCallback()


def start(hub: tuple[str, ...] = ()) -> PhaseClock:
    """This process's clock, heartbeat thread started (its stacks: register() once the output is known good); while
    it loads, the bytes of the `hub` folders (hub_folders) in its Hub cache."""
    cache = hub_cache()
    downloaded = (lambda: downloaded_bytes(cache, hub)) if hub else None
    return PhaseClock(int(os.environ.get("RANK", "0")), directory=beat_dir(), stacks="", downloaded=downloaded).start()


def register(clock: PhaseClock, output_dir: str) -> None:
    """This process's stacks into <output>/stalls/attempt-N/rank-R.txt on STACKS_SIGNAL. Called after the trainer's
    cheap input checks: a job refused for its inputs writes nothing into its output volume."""
    path = stacks_path(output_dir, os.environ.get(C.ATTEMPT_ENV, "0"), clock.rank)
    if register_stacks(path):
        clock.stacks = path
