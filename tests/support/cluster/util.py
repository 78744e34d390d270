"""Process, port, binary and certificate helpers shared by the control-plane classes.

Nothing here imports grpo_operator, kopf or the kubernetes client.
"""

from __future__ import annotations

import ctypes
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]


class BinaryNotFound(RuntimeError):
    """A control-plane binary is not installed (run scripts/install-test-deps.sh)."""


def tools_bin_dir() -> Path:
    """Where install-test-deps.sh puts the binaries: $GRPO_TOOLS_BIN or <repo>/.tools/bin."""
    return Path(os.environ.get("GRPO_TOOLS_BIN") or REPO_ROOT / ".tools" / "bin")


def find_binary(name: str) -> Path:
    """Locate a binary: $GRPO_<NAME>_BIN, then .tools/bin, then PATH."""
    env = os.environ.get("GRPO_" + name.upper().replace("-", "_") + "_BIN")
    candidates = [Path(env)] if env else []
    candidates.append(tools_bin_dir() / name)
    found = shutil.which(name)
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise BinaryNotFound(
        f"{name} not found (looked at {', '.join(map(str, candidates)) or 'PATH'}); "
        "run scripts/install-test-deps.sh"
    )


def missing_binaries(names: Sequence[str]) -> list[str]:
    out = []
    for n in names:
        try:
            find_binary(n)
        except BinaryNotFound:
            out.append(n)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.05,
               what: str = "condition", check: Callable[[], None] | None = None) -> Any:
    """Poll ``pred`` until it returns a truthy value; ``check`` may raise to abort early."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        if check is not None:
            check()
        try:
            value = pred()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}"
                               + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


# ------------------------------------------------------------------------------------------ work dirs


def _proc_start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def claim_workdir(workdir: Path) -> None:
    """Record this process as the owner of ``workdir`` (for ``sweep_stale_workdirs``)."""
    (workdir / "owner").write_text(f"{os.getpid()} {_proc_start_time(os.getpid())}\n")


def sweep_stale_workdirs(base: str | os.PathLike[str] | None, prefixes: Sequence[str]) -> None:
    """Remove work dirs left by test processes that were SIGKILLed (their children died with them
    through PDEATHSIG, but the dirs -- etcd preallocates 64 MB WAL files -- stay in /dev/shm).
    Only dirs with an ``owner`` file naming a process that no longer exists are touched."""
    import tempfile

    base_path = Path(base or tempfile.gettempdir())
    for prefix in prefixes:
        for d in base_path.glob(prefix + "*"):
            try:
                pid_s, start = (d / "owner").read_text().split()
                pid = int(pid_s)
            except (OSError, ValueError):
                continue
            if pid == os.getpid() or _proc_start_time(pid) == start:
                continue  # still alive (same pid and start time)
            shutil.rmtree(d, ignore_errors=True)


def default_workdir_base() -> str | None:
    base = os.environ.get("GRPO_TEST_WORKDIR_BASE")
    if base:
        return base
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize > 2 * 1024**3:
            return str(shm)
    return None


def make_workdir(workdir: str | os.PathLike[str] | None, prefix: str,
                 keep_workdir: bool | None) -> tuple[Path, bool, bool]:
    """(work dir, owned by us, keep it afterwards) for a test server: a given dir as is, or a fresh claimed one
    under default_workdir_base() after sweeping those left by killed runs."""
    import tempfile

    if keep_workdir is None:
        keep_workdir = os.environ.get("GRPO_TEST_KEEP_WORKDIR", "") not in ("", "0")
    if workdir is not None:
        return Path(workdir), False, keep_workdir
    sweep_stale_workdirs(default_workdir_base(), ("grpo-cp-", "grpo-cel-"))
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=default_workdir_base()))
    claim_workdir(path)
    return path, True, keep_workdir


# ------------------------------------------------------------------------------------------ processes

_PR_SET_PDEATHSIG = 1


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process (less noisy than wall time on a shared 2-core machine)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ManagedProcess:
    """One long-running child, its log file, and a PID-based stop.

    Children get PR_SET_PDEATHSIG=SIGKILL when started from the main thread, so they die with the
    test process even when it is SIGKILLed (from another thread this is skipped: the signal fires
    when the *thread* that forked exits).
    """

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen | None = field(default=None, init=False)
    log_offset: int = field(default=0, init=False)  # where the current run's log starts

    def start(self) -> None:
        if self.running:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")
        self.log_offset = logf.tell()
        logf.write(f"\n===== start {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n".encode())
        logf.flush()
        main = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=self.cwd, start_new_session=True,
                preexec_fn=_pdeathsig if main else None,
            )
        finally:
            logf.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process by PID, SIGKILL after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL (a crash, for reliability tests)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def rss(self) -> int | None:
        return rss_bytes(self.proc.pid) if self.running else None

    def log_since_start(self) -> str:
        """The log of the current run only (the file is appended to across restarts)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------------------ HTTP


@dataclass
class HTTPResult:
    status: int
    body: Any  # parsed JSON when possible, else text

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        """The Status message of an error (or the raw text)."""
        if isinstance(self.body, dict):
            return str(self.body.get("message", ""))
        return str(self.body)

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", "")) if isinstance(self.body, dict) else ""


def http_request(url: str, method: str = "GET", body: Any = None, *, token: str | None = None,
                 content_type: str = "application/json", ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 30.0) -> HTTPResult:
    data = None
    headers = {"Accept": "application/json"}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = content_type
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_context) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    text = raw.decode(errors="replace")
    try:
        parsed: Any = json.loads(text) if text else None
    except ValueError:
        parsed = text
    return HTTPResult(status, parsed)


# ------------------------------------------------------------------------------------------ PKI


@dataclass
class PKI:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path


def make_pki(directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> PKI:
    """A CA, a serving certificate for ``hosts`` (+ in-cluster names), and a service-account RSA key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    later = now + datetime.timedelta(days=30)

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "grpo-test-ca")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    all_hosts = list(hosts) + ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                               "kubernetes.default.svc.cluster.local", "10.0.0.1"]
    for h in dict.fromkeys(all_hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name).public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = PKI(directory / "ca.crt", directory / "ca.key", directory / "serving.crt",
              directory / "serving.key", directory / "sa.key", directory / "sa.pub")
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.ca_key.write_bytes(pem_key(ca_key))
    pki.serving_cert.write_bytes(srv_cert.public_bytes(serialization.Encoding.PEM))
    pki.serving_key.write_bytes(pem_key(srv_key))
    pki.sa_key.write_bytes(sa_key.private_bytes(serialization.Encoding.PEM,
                                                serialization.PrivateFormat.TraditionalOpenSSL,
                                                serialization.NoEncryption()))
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    for p in (pki.ca_key, pki.serving_key, pki.sa_key):
        p.chmod(0o600)
    return pki
