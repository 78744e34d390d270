"""The node tier's cluster: a real single-node Kubernetes (scripts/node/up.sh), or any cluster of
$GRPO_TEST_KUBECONFIG (kind, k3d, a real one) with the images already loaded.

    with NodeCluster.start() as node:           # up.sh; down.sh ALWAYS on leaving (error, timeout, Ctrl-C, SIGTERM)
        node.import_images([archive])           # ctr -n k8s.io images import (local node only)
        node.kubectl("get", "nodes")
        node.kill_container_main_process(ns, pod, container)   # SIGKILL from the host, as an OOM kill would

Teardown is guaranteed three ways: the context manager's __exit__ (pytest runs fixture teardown on
failures, pytest-timeout and KeyboardInterrupt), a SIGTERM handler that turns `timeout`/CI cancellation
into KeyboardInterrupt while the cluster is up, and atexit.  A SIGKILLed test process cannot clean up: the
next up.sh finds the stale state and runs down.sh first (scripts/node/up.sh).

`host_snapshot()` records what the node changes on the host (processes, mounts, links, iptables, sysctls,
cgroups, files in the kubelet's hard-coded paths) so a test can prove down.sh restores it.
Nothing here imports grpo_operator.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.processes import descendants, rank_of

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "node"
TOOLS = Path(os.environ.get("GRPO_TOOLS_BIN") or REPO / ".tools" / "bin")
DEFAULT_STATE = Path(os.environ.get("GRPO_NODE_STATE", "/tmp/grpo-node"))
# One real node per machine (fixed host paths, ports, iptables): concurrent test runs (several checkouts on one
# machine) wait for each other here instead of tearing each other's node down.
NODE_LOCK = Path(os.environ.get("GRPO_NODE_LOCK", "/tmp/grpo-node.lock"))
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy", "kube-apiserver", "kube-controller-manager", "kubectl")
HOST_COMMANDS = ("containerd", "ctr", "runc", "iptables", "iptables-save", "conntrack", "ip", "etcd", "busybox",
                 "mmdebstrap", "gcc", "openssl", "curl")
SYSCTLS = ("net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables", "net.ipv4.conf.all.route_localnet",
           "vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes")


class NodeUnavailable(RuntimeError):
    """This machine cannot run the node tier (not root, or install-test-deps.sh not run)."""


def node_unavailable_reason() -> str | None:
    """Why a local node cannot start here, or None."""
    if os.geteuid() != 0:
        return "the node tier needs root (kubelet, containerd, iptables)"
    missing = [b for b in NODE_BINARIES if not (TOOLS / b).is_file()]
    missing += [c for c in HOST_COMMANDS if shutil.which(c) is None]
    if not Path("/usr/lib/cni/bridge").is_file():
        missing.append("/usr/lib/cni/bridge")
    if missing:
        return f"missing {', '.join(missing)}: run scripts/install-test-deps.sh"
    return None


def _run(argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600,
         check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run(list(argv), env=env, text=True, capture_output=True, timeout=timeout, input=input)
    if check and cp.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {cp.returncode}:\n{cp.stdout[-4000:]}\n{cp.stderr[-4000:]}")
    return cp


def wait_for(pred: Callable[[], Any], timeout: float, interval: float = 0.5, what: str = "condition") -> Any:
    """Poll pred() until truthy; the value.  TimeoutError naming `what` (and pred's last exception).  An
    AssertionError from pred ends the wait at once: it says the awaited state can no longer come."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except AssertionError:
            raise
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}" + (f" (last error: {last})" if last else ""))
        time.sleep(interval)


@dataclass
class NodeCluster:
    """A cluster for the node tier.  `external`: a cluster we did not start (GRPO_TEST_KUBECONFIG)."""

    kubeconfig: Path
    external: bool
    state: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _up: bool = False
    _old_sigterm: Any = None
    _lock_fd: int | None = None

    # ---------------------------------------------------------------- start / stop
    @classmethod
    def start(cls, state: Path | None = None, *, dns: bool = True) -> NodeCluster:
        external = os.environ.get("GRPO_TEST_KUBECONFIG")
        if external:
            return cls(kubeconfig=Path(external), external=True)
        reason = node_unavailable_reason()
        if reason:
            raise NodeUnavailable(reason)
        node = cls(kubeconfig=(state or DEFAULT_STATE) / "kubeconfig", external=False, state=state or DEFAULT_STATE)
        node._install_guards()
        try:
            t0 = time.monotonic()
            node._lock_fd = os.open(NODE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(node._lock_fd, fcntl.LOCK_EX)  # released by stop(), or by the kernel when the process dies
            node.timings["lock_wait_s"] = time.monotonic() - t0
            t0 = time.monotonic()
            _run(["bash", str(SCRIPTS / "prepare.sh")], env=node.env, timeout=900)
            node.timings["prepare_s"] = time.monotonic() - t0
            t0 = time.monotonic()
            node._up = True  # from here on, leaving must run down.sh (up.sh may have started something)
            _run(["bash", str(SCRIPTS / "up.sh"), *([] if dns else ["--no-dns"])], env=node.env, timeout=600)
            node.timings["up_s"] = time.monotonic() - t0
        except BaseException:
            node.stop()
            raise
        return node

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.state is not None:
            env["STATE"] = str(self.state)
        env["KUBE_BIN"] = str(TOOLS)
        env["KUBECTL"] = str(TOOLS / "kubectl")
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def stop(self) -> None:
        """down.sh (idempotent).  Never raises: teardown must not hide the test's own error."""
        if self.external or not self._up:
            self._unlock()
            return
        t0 = time.monotonic()
        try:
            # Ctrl-C during teardown must not stop the teardown half-way
            with _signals_deferred():
                cp = _run(["bash", str(SCRIPTS / "down.sh")], env=self.env, timeout=300, check=False)
            self.down_log = cp.stderr
        finally:
            self._up = False
            self.timings["down_s"] = time.monotonic() - t0
            self._remove_guards()
            self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> NodeCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _install_guards(self) -> None:
        atexit.register(self.stop)
        if threading.current_thread() is threading.main_thread():
            def on_sigterm(signum: int, frame: Any) -> None:  # `timeout`, CI cancel: tear down like Ctrl-C
                raise KeyboardInterrupt(f"signal {signum}")

            self._old_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    def _remove_guards(self) -> None:
        atexit.unregister(self.stop)
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    # ---------------------------------------------------------------- using it
    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _run([str(kubectl_path()), "--kubeconfig", str(self.kubeconfig), *args], check=check,
                    input=input, timeout=timeout)

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    @property
    def ctr(self) -> list[str]:
        assert self.state is not None, "containerd is only reachable on the local node"
        return ["ctr", "--address", str(self.state / "run" / "containerd" / "containerd.sock"), "-n", "k8s.io"]

    def images(self) -> dict[str, str]:
        """name → target digest of the images in the node's containerd."""
        if self.external:
            return {}
        out = {}
        for line in _run([*self.ctr, "images", "ls"]).stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3:
                out[parts[0]] = parts[2]
        return out

    def import_images(self, archives: Iterable[Path]) -> float:
        """Import OCI archives into the node's containerd, unless every image an archive names is there with the
        archive's digest (containerd's root outlives down.sh: a 1 GB import is paid once per build).  Seconds taken.
        On an external cluster the images must already be loaded (kind load / k3d image import)."""
        if self.external:
            return 0.0
        t0 = time.monotonic()
        have = self.images()
        for a in archives:
            with tarfile.open(a) as tf:
                index = json.load(tf.extractfile("index.json"))  # type: ignore[arg-type]
            wanted = {m.get("annotations", {}).get("io.containerd.image.name"): m["digest"]
                      for m in index.get("manifests", [])}
            if not wanted or any(have.get(n) != d for n, d in wanted.items()):
                _run([*self.ctr, "images", "import", str(a)], timeout=900)
        return time.monotonic() - t0

    def node_name(self) -> str:
        return self.kubectl_json("get", "nodes")["items"][0]["metadata"]["name"]

    def volume_dir(self, name: str) -> Path:
        """A directory on the local node for a `local` PersistentVolume (removed by remove_volumes)."""
        assert self.state is not None
        d = self.state / "volumes" / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def remove_volumes(self) -> None:
        if self.state is not None:
            shutil.rmtree(self.state / "volumes", ignore_errors=True)

    def container_host_pid(self, namespace: str, pod: str, container: str) -> int:
        st = self.kubectl_json("get", "pod", pod, "-n", namespace)
        cid = next(c["containerID"] for c in st["status"]["containerStatuses"] if c["name"] == container)
        cid = cid.split("://", 1)[1]
        for line in _run([*self.ctr, "tasks", "ls"]).stdout.splitlines()[1:]:
            parts = line.split()
            if parts and parts[0] == cid:
                return int(parts[1])
        raise RuntimeError(f"no running task for container {cid} of {namespace}/{pod}")

    def kill_container_main_process(self, namespace: str, pod: str, container: str) -> str:
        """SIGKILL the container's main process as an OOM kill or node fault would.  Local node: from the
        host, by its host PID.  External cluster (no host access): every process of the container but PID 1,
        from inside (PID 1 cannot be SIGKILLed from its own namespace); the container then fails the same way."""
        if not self.external:
            pid = self.container_host_pid(namespace, pod, container)
            os.kill(pid, signal.SIGKILL)
            return f"host pid {pid}"
        self._kill_inside(namespace, pod, container, "int(p) not in (1, os.getpid())")
        return "in-container SIGKILL"

    def kill_worker_processes(self, namespace: str, pod: str, container: str) -> str:
        """SIGKILL torchrun's worker processes of the container (the descendants of its main process, the elastic
        agent, named grpo-rank-N), not the container: what a crash of the training process is while its pod and
        node stay healthy.  Local node: from the host; external cluster: from inside (the workers' parent is PID 1)."""
        if not self.external:
            agent = self.container_host_pid(namespace, pod, container)
            workers = children_with_rank(agent)
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            return f"host pids {sorted(workers)} (ranks {sorted(workers.values())}), under {agent}"
        self._kill_inside(namespace, pod, container, "open(f'/proc/{p}/comm').read().startswith('grpo-rank-')")
        return "in-container SIGKILL of the workers"

    def _kill_inside(self, namespace: str, pod: str, container: str, which: str) -> None:
        """SIGKILL, from a `python -c` inside the container, every process `p` (a /proc entry) for which the Python
        expression `which` holds."""
        script = ("import os,signal\n"
                  "for p in os.listdir('/proc'):\n"
                  "    try:\n"
                  f"        if p.isdigit() and {which}: os.kill(int(p), signal.SIGKILL)\n"
                  "    except OSError: pass\n")
        self.kubectl("exec", "-n", namespace, pod, "-c", container, "--", "python", "-c", script, check=False)


def children_with_rank(parent: int) -> dict[int, str]:
    """The host PIDs of `parent`'s descendants that are trainer workers → their global rank (forked workers carry it in
    their process name: tests/support/processes.py)."""
    return {pid: rank for pid in descendants(parent) if (rank := rank_of(pid)) is not None}


def kubectl_path() -> Path:
    p = TOOLS / "kubectl"
    if p.exists():
        return p
    found = shutil.which("kubectl")
    if not found:
        raise NodeUnavailable("kubectl not found: run scripts/install-test-deps.sh")
    return Path(found)


class _signals_deferred:
    """Hold SIGINT/SIGTERM while a block runs (teardown), deliver them after."""

    def __enter__(self) -> None:
        self.pending: list[int] = []
        self.main = threading.current_thread() is threading.main_thread()
        if self.main:
            self.old = {s: signal.signal(s, lambda n, f: self.pending.append(n)) for s in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *exc: Any) -> None:
        if self.main:
            for s, h in self.old.items():
                signal.signal(s, h)
            if self.pending:
                raise KeyboardInterrupt(f"signal {self.pending[0]} during teardown")


# -------------------------------------------------------------------- host snapshot (leak check)
def _lines(argv: Sequence[str]) -> list[str]:
    try:
        return subprocess.run(list(argv), text=True, capture_output=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return []


def node_processes(state: Path) -> list[str]:
    """Processes that belong to a node (ours): by their command line naming the state dir or a node
    binary, or by living in a kubepods cgroup.  Zombies are ignored (init reaps daemons whose parent left)."""
    out = []
    s = str(state)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            stat = Path(f"/proc/{pid}/stat").read_text()
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        exe = cmd.split(" ", 1)[0].rsplit("/", 1)[-1]
        if s in cmd or exe in ("kubelet", "kube-proxy", "kube-scheduler", "containerd-shim-runc-v2") \
                or (exe in ("kube-apiserver", "kube-controller-manager", "etcd", "containerd") and s in cmd) \
                or "/kubepods" in cgroup:
            out.append(f"{pid} {cmd[:200]}")
    return sorted(out)


def host_snapshot(state: Path) -> dict[str, Any]:
    """What a node can leave behind on the host.  Compare a snapshot before up.sh with one after down.sh."""
    s = str(state)
    iptables = {}
    for table in ("nat", "filter", "mangle"):
        iptables[table] = sorted(l for l in _lines(["iptables-save", "-t", table])
                                 if l.startswith(("-A", ":")))
        iptables[table] = [l.split(" [")[0] for l in iptables[table]]  # chain counters change by themselves
    cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods*")) + \
        sorted(str(p) for p in Path("/sys/fs/cgroup").glob("kubepods*"))
    sysctls = {k: (_lines(["sysctl", "-n", k]) or ["?"])[0] for k in SYSCTLS}
    # (only the node's own places: an image build elsewhere on the machine may mount overlays meanwhile)
    mounts = sorted(m for m in _lines(["findmnt", "-rn", "-o", "TARGET,FSTYPE"])
                    if s in m or "/var/lib/kubelet" in m or "/run/containerd" in m or "/run/netns" in m)
    links = sorted(l.split(":")[1].strip().split("@")[0] for l in _lines(["ip", "-o", "link"]) if ":" in l)
    files = {p: sorted(os.listdir(p)) if os.path.isdir(p) else None
             for p in ("/var/log/pods", "/var/log/containers", "/var/lib/cni", "/run/containerd", "/run/netns")}
    return {"processes": node_processes(state), "mounts": mounts, "links": links, "iptables": iptables,
            "sysctls": sysctls, "cgroups": cgroups, "files": files}


def snapshot_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """{key: (only before, only after)} for every part that differs."""
    diff: dict[str, Any] = {}
    for k in before:
        a, b = before[k], after.get(k)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            diff[k] = {"gone": sorted(set(a) - set(b)), "new": sorted(set(b) - set(a))}
        elif isinstance(a, dict) and isinstance(b, dict):
            diff[k] = {kk: (a.get(kk), b.get(kk)) for kk in set(a) | set(b) if a.get(kk) != b.get(kk)}
        else:
            diff[k] = (a, b)
    return diff
