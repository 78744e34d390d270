"""A real Kubernetes control plane for tests: etcd 3.4 + kube-apiserver 1.20.2 (+ controller-manager).

    with ControlPlane(authorization_mode="RBAC") as cp:
        cp.kubectl("create", "namespace", "demo")
        os.environ["KUBECONFIG"] = str(cp.kubeconfig)      # before importing kubernetes/kopf clients

What is real: discovery, OpenAPI validation/defaulting of CRD schemas, status subresources,
resourceVersion/generation, PATCH content-type rules, admission webhooks, RBAC, TokenRequest, and
(with the controller-manager) garbage collection of ownerReferences, namespace deletion, default
service accounts.  What is not: no scheduler/kubelet (pods stay Pending: patch their status through
the status subresource to play the kubelet), no CEL (1.20 drops x-kubernetes-validations; see
celserver.py).

Identities (kube-apiserver --token-auth-file, read ONLY at apiserver start in 1.20):
  * admin: ``cp.admin_token``, user ``admin`` in ``system:masters`` (what ``cp.kubeconfig`` uses).
  * service accounts, two ways:
      - ``cp.service_account_token(ns, name)``: a real, signed SA token from the TokenRequest API
        (``serviceaccounts/<name>/token``); creates the SA if missing; no restart; RBAC sees user
        ``system:serviceaccount:<ns>:<name>`` with groups ``system:serviceaccounts[:<ns>]``.
      - ``cp.static_service_account_token(ns, name)``: a line in the static token file mapped to the
        same user and groups.  Needs an apiserver restart (done for you, ~2-3 s) unless listed up
        front in ``ControlPlane(static_service_accounts=[(ns, name), ...])``.
  ``cp.write_kubeconfig(path, token)`` / ``cp.kubectl_as(token)`` act as that identity.

Processes are stopped by PID (SIGTERM, then SIGKILL) on ``stop()``/``__exit__``, at interpreter exit
(atexit), and die with the test process via PR_SET_PDEATHSIG when started from the main thread.
Ports are picked free on 127.0.0.1 once and kept across ``restart()``.

Environment: GRPO_TEST_KEEP_WORKDIR=1 keeps the work dir (logs under ``<workdir>/logs``);
GRPO_TEST_WORKDIR_BASE chooses where work dirs go (default /dev/shm when writable, else $TMPDIR).
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import secrets
import shutil
import ssl
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .kubectl import Kubectl
from .util import (
    PKI,
    HTTPResult,
    ManagedProcess,
    find_binary,
    free_port,
    http_request,
    make_pki,
    make_workdir,
    wait_until,
)

# clusterrole-aggregation: fills the built-in admin/edit/view ClusterRoles from labelled roles (the chart's
# grpojob-edit/-view); without it `edit` grants nothing at all.
DEFAULT_CONTROLLERS = ("garbagecollector", "namespace", "serviceaccount", "serviceaccount-token",
                       "clusterrole-aggregation")
SA_ISSUER = "https://kubernetes.default.svc"

_LIVE: weakref.WeakSet[ControlPlane] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for cp in list(_LIVE):
        try:
            cp.stop()
        except Exception:
            pass


@dataclass(frozen=True)
class StaticToken:
    token: str
    user: str
    uid: str
    groups: tuple[str, ...] = ()

    def csv_line(self) -> str:
        line = f"{self.token},{self.user},{self.uid}"
        if self.groups:
            line += ',"' + ",".join(self.groups) + '"'
        return line


def sa_user(namespace: str, name: str) -> tuple[str, tuple[str, ...]]:
    return (f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"))


class ControlPlane:
    """etcd + kube-apiserver 1.20.2 (+ kube-controller-manager 1.20.2) on free 127.0.0.1 ports."""

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        authorization_mode: str = "RBAC",
        controller_manager: bool = True,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        service_cluster_ip_range: str = "10.0.0.0/24",
        static_service_accounts: Iterable[tuple[str, str]] = (),
        extra_apiserver_args: Sequence[str] = (),
        extra_controller_manager_args: Sequence[str] = (),
        startup_timeout: float = 90.0,
        keep_workdir: bool | None = None,
        verbosity: int = 1,
    ):
        if authorization_mode in ("AlwaysAllow", "RBAC", "Node,RBAC"):
            pass
        elif "RBAC" not in authorization_mode and authorization_mode != "AlwaysAllow":
            raise ValueError(f"unsupported authorization mode {authorization_mode!r}")
        self.authorization_mode = authorization_mode
        self.with_controller_manager = controller_manager
        self.controllers = tuple(controllers)
        self.service_cluster_ip_range = service_cluster_ip_range
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.extra_controller_manager_args = list(extra_controller_manager_args)
        self.startup_timeout = startup_timeout
        self.verbosity = verbosity
        self.workdir, self._own_workdir, self.keep_workdir = make_workdir(workdir, "grpo-cp-", keep_workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logdir = self.workdir / "logs"

        self.etcd_bin = find_binary("etcd")
        self.apiserver_bin = find_binary("kube-apiserver")
        self.kcm_bin = find_binary("kube-controller-manager") if controller_manager else None

        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.kcm_port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"

        self.pki: PKI = make_pki(self.workdir / "pki")
        self.admin_token = secrets.token_hex(16)
        self._static_tokens: list[StaticToken] = [
            StaticToken(self.admin_token, "admin", "admin", ("system:masters",))]
        for ns, name in static_service_accounts:
            self._add_static_sa(ns, name)
        self.token_file = self.workdir / "tokens.csv"
        self._write_token_file()
        self.kubeconfig = self.write_kubeconfig(self.workdir / "kubeconfig", self.admin_token, "admin")
        self._ssl = ssl.create_default_context(cafile=str(self.pki.ca_cert))

        self.etcd = ManagedProcess("etcd", self._etcd_argv(), self.logdir / "etcd.log")
        self.apiserver = ManagedProcess("kube-apiserver", self._apiserver_argv(),
                                        self.logdir / "kube-apiserver.log")
        self.controller_manager = (
            ManagedProcess("kube-controller-manager", self._kcm_argv(),
                           self.logdir / "kube-controller-manager.log")
            if controller_manager else None)
        self.timings: dict[str, float] = {}
        self.kubectl = Kubectl(self.kubeconfig, cache_dir=self.workdir / "kubectl-cache")
        _LIVE.add(self)

    # ------------------------------------------------------------------ argv
    def _etcd_argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            str(self.etcd_bin), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}", "--initial-cluster-state=new",
            # one member: no peers to wait for, so a short election timeout only speeds up start
            "--heartbeat-interval=25", "--election-timeout=250",
            "--logger=zap", "--log-level=warn", "--snapshot-count=10000",
            "--quota-backend-bytes=1073741824",
        ]

    def _apiserver_argv(self) -> list[str]:
        return [
            str(self.apiserver_bin),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}", "--insecure-port=0",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={self.pki.serving_cert}", f"--tls-private-key-file={self.pki.serving_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--token-auth-file={self.token_file}",
            f"--authorization-mode={self.authorization_mode}",
            f"--service-cluster-ip-range={self.service_cluster_ip_range}",
            "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount",
            # 127.0.0.1 is not a valid endpoint for the `kubernetes` Service: don't reconcile it.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--logtostderr=true", f"--v={self.verbosity}",
            *self.extra_apiserver_args,
        ]

    def _kcm_argv(self) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            str(self.kcm_bin),
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={self.kcm_port}", "--port=0",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
            "--authentication-skip-lookup=true",
            "--leader-elect=false", "--use-service-account-credentials=false",
            f"--controllers={','.join(self.controllers)}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            "--profiling=false",
            "--logtostderr=true", f"--v={self.verbosity}",
            *self.extra_controller_manager_args,
        ]

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        self.start_etcd()
        self.start_apiserver()
        if self.controller_manager is not None:
            self.start_controller_manager()
        return self

    def start_etcd(self) -> None:
        t0 = time.monotonic()
        self.etcd.start()
        def healthy() -> bool:
            body = http_request(self.etcd_url + "/health", timeout=2).body
            return isinstance(body, dict) and body.get("health") == "true"

        wait_until(healthy, self.startup_timeout, what="etcd /health", check=self.etcd.check_alive)
        self.timings["etcd"] = time.monotonic() - t0

    def start_apiserver(self) -> None:
        t0 = time.monotonic()
        self.apiserver.start()

        def ready() -> bool:
            r = self.api("GET", "/readyz", timeout=5)
            return r.status == 200 and self.api("GET", "/api/v1/namespaces/default", timeout=5).ok

        wait_until(ready, self.startup_timeout, interval=0.1, what="kube-apiserver /readyz",
                   check=self._check_apiserver)
        self.timings["apiserver"] = time.monotonic() - t0

    def _check_apiserver(self) -> None:
        self.etcd.check_alive()
        self.apiserver.check_alive()

    def start_controller_manager(self) -> None:
        assert self.controller_manager is not None
        t0 = time.monotonic()
        self.controller_manager.start()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{self.kcm_port}/healthz"
        kcm = self.controller_manager

        def ready() -> bool:
            # /healthz answers before the controllers are built; an apiserver outage in that
            # window makes a 1.20 controller-manager exit ("unable to get any supported
            # resources").  With the GC on, wait until it has synced all its monitors.
            if http_request(url, ssl_context=insecure, timeout=5).status != 200:
                return False
            if "garbagecollector" in self.controllers:
                return "all resource monitors have synced" in kcm.log_since_start()
            return True

        wait_until(ready, self.startup_timeout, interval=0.1,
                   what="kube-controller-manager /healthz and garbage collector synced",
                   check=kcm.check_alive)
        self.timings["controller-manager"] = time.monotonic() - t0

    def stop(self, graceful: bool | None = None) -> None:
        """Stop everything by PID (idempotent) and remove the work dir (unless kept).

        Graceful (SIGTERM, then SIGKILL after 10 s) when the work dir survives; otherwise SIGKILL
        at once: the data is thrown away, and a graceful apiserver shutdown costs 1-2 s."""
        if graceful is None:
            graceful = self.keep_workdir or not self._own_workdir
        for p in (self.controller_manager, self.apiserver, self.etcd):
            if p is not None:
                p.stop() if graceful else p.kill()
        _LIVE.discard(self)
        if self._own_workdir and not self.keep_workdir and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self, *, controller_manager: bool = False, kill: bool = False,
                downtime: float = 0.0) -> None:
        """Stop apiserver + etcd (SIGTERM, or SIGKILL with ``kill=True``), wait ``downtime`` s, start
        them again on the same ports with the same etcd data dir.  The controller-manager keeps
        running (it reconnects) unless ``controller_manager=True`` or it died meanwhile."""
        kcm = self.controller_manager
        if controller_manager and kcm is not None:
            kcm.stop()
        for p in (self.apiserver, self.etcd):
            p.kill() if kill else p.stop()
        if downtime:
            time.sleep(downtime)
        self.start_etcd()
        self.start_apiserver()
        if kcm is not None and not kcm.running:
            self.start_controller_manager()

    def restart_controller_manager(self) -> None:
        """Restart kube-controller-manager (~1-2 s).  Do this after installing CRDs whose objects own
        others: the 1.20 garbage collector re-reads discovery only every 30 s, so until then it
        neither watches the new kind nor collects its dependents (a 30-60 s delay); a fresh
        controller-manager discovers the CRD at start."""
        if self.controller_manager is None:
            raise RuntimeError("this control plane runs without kube-controller-manager")
        self.controller_manager.stop()
        self.start_controller_manager()

    def restart_apiserver(self) -> None:
        """Restart only kube-apiserver (e.g. to reload the static token file)."""
        self.apiserver.stop()
        self.start_apiserver()

    # ------------------------------------------------------------------ access
    @property
    def env(self) -> dict[str, str]:
        """os.environ + KUBECONFIG for subprocesses (operator, helm, ...)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    @property
    def ca_file(self) -> Path:
        return self.pki.ca_cert

    def api(self, method: str, path: str, body: Any = None, *, token: str | None = None,
            content_type: str = "application/json", timeout: float = 30.0) -> HTTPResult:
        """A raw HTTPS request to the API server (admin token unless ``token``)."""
        return http_request(self.server + path, method, body, token=token or self.admin_token,
                            content_type=content_type, ssl_context=self._ssl, timeout=timeout)

    def write_kubeconfig(self, path: str | os.PathLike[str], token: str, user: str = "user",
                         namespace: str | None = None) -> Path:
        path = Path(path)
        ctx: dict[str, Any] = {"cluster": "grpo-test", "user": user}
        if namespace:
            ctx["namespace"] = namespace
        cfg = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "grpo-test", "cluster": {
                "server": self.server,
                "certificate-authority-data": base64.b64encode(self.pki.ca_cert.read_bytes()).decode(),
            }}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "grpo-test", "context": ctx}],
            "current-context": "grpo-test",
        }
        path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML: no PyYAML needed
        path.chmod(0o600)
        return path

    def kubectl_as(self, token: str, name: str | None = None) -> Kubectl:
        """A Kubectl using ``token`` instead of the admin token."""
        name = name or "user-" + token[:8]
        kc = self.write_kubeconfig(self.workdir / f"kubeconfig-{name}", token, name)
        return Kubectl(kc, cache_dir=self.workdir / "kubectl-cache")

    # ------------------------------------------------------------------ identities
    def ensure_namespace(self, namespace: str) -> None:
        r = self.api("POST", "/api/v1/namespaces",
                     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        if not (r.ok or r.status == 409):
            raise RuntimeError(f"create namespace {namespace}: {r.status} {r.message}")

    def service_account_token(self, namespace: str, name: str, *, create: bool = True,
                              expiration_seconds: int = 3600) -> str:
        """A real SA token via TokenRequest (creates namespace + SA when ``create``)."""
        if create:
            self.ensure_namespace(namespace)
            r = self.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                         {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
            if not (r.ok or r.status == 409):
                raise RuntimeError(f"create serviceaccount {namespace}/{name}: {r.status} {r.message}")
        r = self.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                     {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                      "spec": {"expirationSeconds": expiration_seconds}})
        if not r.ok:
            raise RuntimeError(f"TokenRequest {namespace}/{name}: {r.status} {r.message}")
        return r.body["status"]["token"]

    def _add_static_sa(self, namespace: str, name: str) -> StaticToken:
        user, groups = sa_user(namespace, name)
        for t in self._static_tokens:
            if t.user == user:
                return t
        tok = StaticToken(secrets.token_hex(16), user, f"sa-{namespace}-{name}", groups)
        self._static_tokens.append(tok)
        return tok

    def _write_token_file(self) -> None:
        self.token_file.write_text("".join(t.csv_line() + "\n" for t in self._static_tokens))
        self.token_file.chmod(0o600)

    def add_static_token(self, user: str, groups: Sequence[str] = (), *, uid: str | None = None,
                         restart: bool = True) -> str:
        """Add a static bearer token for any user; restarts kube-apiserver if it is running
        (1.20 reads --token-auth-file only at start) unless ``restart=False``."""
        tok = StaticToken(secrets.token_hex(16), user, uid or user, tuple(groups))
        self._static_tokens.append(tok)
        self._write_token_file()
        if restart and self.apiserver.running:
            self.restart_apiserver()
        return tok.token

    def static_service_account_token(self, namespace: str, name: str, *, restart: bool = True) -> str:
        """A static token for user ``system:serviceaccount:<ns>:<name>`` in groups
        ``system:serviceaccounts``, ``system:serviceaccounts:<ns>``.  No ServiceAccount object is
        needed.  Restarts kube-apiserver when the token is new and the server is running."""
        before = len(self._static_tokens)
        tok = self._add_static_sa(namespace, name)
        if len(self._static_tokens) != before:
            self._write_token_file()
            if restart and self.apiserver.running:
                self.restart_apiserver()
        return tok.token

    # ------------------------------------------------------------------ diagnostics
    def processes(self) -> dict[str, ManagedProcess]:
        procs = {"etcd": self.etcd, "kube-apiserver": self.apiserver}
        if self.controller_manager is not None:
            procs["kube-controller-manager"] = self.controller_manager
        return procs

    def rss(self) -> dict[str, int | None]:
        """Resident memory in bytes per running component."""
        return {name: p.rss() for name, p in self.processes().items()}

    def logs(self, component: str = "kube-apiserver", lines: int = 60) -> str:
        return self.processes()[component].log_tail(lines)

    def __repr__(self) -> str:
        return f"<ControlPlane {self.server} authz={self.authorization_mode} workdir={self.workdir}>"
