"""pytest fixtures for a real control plane and the CEL CRD server.

Registered once for every tier by tests/conftest.py (``pytest_plugins``).

Fixtures:
  controlplane (session)     ControlPlane (local etcd + kube-apiserver 1.20.2 + controller-manager,
                             RBAC, admin kubeconfig) -- or, when $GRPO_TEST_KUBECONFIG is set, an
                             ExternalCluster for that kubeconfig (kind/k3d/real): same attributes
                             ``kubeconfig``, ``kubectl``, ``env``, ``service_account_token()``.
  kubeconfig (session)       Path of the admin kubeconfig.
  kubectl (session)          tests.support.cluster.kubectl.Kubectl bound to it.
  kubeconfig_env (session)   sets os.environ["KUBECONFIG"] for the whole session (do it before
                             importing kubernetes/kopf clients: they read it at import time).
  k8s_namespace (function)   a fresh namespace name (created; deleted afterwards without waiting).
  controlplane_factory       ``make(**ControlPlane kwargs) -> started ControlPlane`` for tests that
    (function)               need their own cluster (restarts, other authz modes); stopped after.
  celserver (session)        CelServer: etcd + apiextensions-apiserver 1.36 with CEL.

Environment:
  GRPO_TEST_KUBECONFIG       use this existing cluster instead of starting one.
  GRPO_TEST_AUTHZ            authorization mode of the session control plane (default RBAC;
                             AlwaysAllow also works; the admin is system:masters either way).
  GRPO_TEST_REQUIRE_CLUSTER=1  fail instead of skip when binaries are missing (CI).
  GRPO_TEST_KEEP_WORKDIR=1   keep work dirs (logs) after the session.
"""

from __future__ import annotations

import os
import secrets
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .celserver import CelServer
from .controlplane import ControlPlane
from .kubectl import Kubectl
from .util import missing_binaries

__all__ = [
    "controlplane", "kubeconfig", "kubectl", "kubeconfig_env", "k8s_namespace",
    "controlplane_factory", "celserver", "ExternalCluster", "skip_unless_binaries",
]

CONTROLPLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
CEL_BINARIES = ("etcd", "apiextensions-apiserver")

# One instance per process even if this module is registered twice (e.g. imported both as
# `cluster.fixtures` and `tests.cluster.fixtures`, or star-imported into several conftests).
_STATE: dict[str, Any] = sys.modules.setdefault(
    "_grpo_test_cluster_state", types.ModuleType("_grpo_test_cluster_state")).__dict__.setdefault(
    "instances", {})


def skip_unless_binaries(names: tuple[str, ...]) -> None:
    missing = missing_binaries(names)
    if not missing:
        return
    msg = (f"real control plane unavailable: {', '.join(missing)} not installed "
           "(run scripts/install-test-deps.sh)")
    if os.environ.get("GRPO_TEST_REQUIRE_CLUSTER", "") not in ("", "0"):
        pytest.fail(msg + " and GRPO_TEST_REQUIRE_CLUSTER is set", pytrace=False)
    pytest.skip(msg)


class ExternalCluster:
    """An existing cluster given by $GRPO_TEST_KUBECONFIG (kind, k3d, a real one)."""

    is_external = True
    controller_manager = True  # a real cluster garbage-collects

    def __init__(self, kubeconfig: str | os.PathLike[str]):
        self.kubeconfig = Path(kubeconfig)
        self.kubectl = Kubectl(self.kubeconfig)
        self.authorization_mode = "external"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def ensure_namespace(self, namespace: str) -> None:
        cp = self.kubectl("create", "namespace", namespace, check=False)
        if cp.returncode != 0 and "AlreadyExists" not in cp.stderr:
            raise RuntimeError(cp.stderr)

    def service_account_token(self, namespace: str, name: str, *, create: bool = True,
                              expiration_seconds: int = 3600) -> str:
        if create:
            self.ensure_namespace(namespace)
            cp = self.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)
            if cp.returncode != 0 and "AlreadyExists" not in cp.stderr:
                raise RuntimeError(cp.stderr)
        return self.kubectl("create", "token", name, "-n", namespace,
                            f"--duration={expiration_seconds}s").stdout.strip()

    def kubectl_as(self, token: str, name: str | None = None) -> Kubectl:
        import json
        import tempfile

        cfg = json.loads(self.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
        cfg["users"] = [{"name": "as-token", "user": {"token": token}}]
        for ctx in cfg["contexts"]:
            ctx["context"]["user"] = "as-token"
        fd, path = tempfile.mkstemp(prefix="kubeconfig-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)
        return Kubectl(path)

    def __getattr__(self, name: str) -> Any:  # restart(), api(), static tokens, ...
        if name.startswith("__"):
            raise AttributeError(name)
        pytest.skip(f"{name}() needs the local control plane (GRPO_TEST_KUBECONFIG is set)")

    def __repr__(self) -> str:
        return f"<ExternalCluster {self.kubeconfig}>"


@pytest.fixture(scope="session")
def controlplane() -> Iterator[ControlPlane | ExternalCluster]:
    external = os.environ.get("GRPO_TEST_KUBECONFIG")
    if external:
        yield ExternalCluster(external)
        return
    cp = _STATE.get("controlplane")
    if cp is not None:
        yield cp
        return
    skip_unless_binaries(CONTROLPLANE_BINARIES)
    cp = ControlPlane(authorization_mode=os.environ.get("GRPO_TEST_AUTHZ", "RBAC"))
    _STATE["controlplane"] = cp
    try:
        cp.start()
    except BaseException:
        cp.stop()
        _STATE.pop("controlplane", None)
        raise
    try:
        yield cp
    finally:
        _STATE.pop("controlplane", None)
        cp.stop()


@pytest.fixture(scope="session")
def kubeconfig(controlplane: ControlPlane | ExternalCluster) -> Path:
    return controlplane.kubeconfig


@pytest.fixture(scope="session")
def kubectl(controlplane: ControlPlane | ExternalCluster) -> Kubectl:
    return controlplane.kubectl


@pytest.fixture(scope="session")
def kubeconfig_env(kubeconfig: Path) -> Iterator[Path]:
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(kubeconfig)
    try:
        yield kubeconfig
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old


@pytest.fixture
def k8s_namespace(controlplane: ControlPlane | ExternalCluster) -> Iterator[str]:
    name = "t-" + secrets.token_hex(4)
    controlplane.ensure_namespace(name)
    try:
        yield name
    finally:
        controlplane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found",
                             check=False)


@pytest.fixture
def controlplane_factory() -> Iterator[Callable[..., ControlPlane]]:
    made: list[ControlPlane] = []

    def make(**kwargs: Any) -> ControlPlane:
        names = CONTROLPLANE_BINARIES if kwargs.get("controller_manager", True) else CONTROLPLANE_BINARIES[:2]
        skip_unless_binaries(names)
        cp = ControlPlane(**kwargs)
        made.append(cp)
        cp.start()
        return cp

    try:
        yield make
    finally:
        for cp in reversed(made):
            cp.stop()


@pytest.fixture(scope="session")
def celserver() -> Iterator[CelServer]:
    srv = _STATE.get("celserver")
    if srv is not None:
        yield srv
        return
    skip_unless_binaries(CEL_BINARIES)
    srv = CelServer()
    _STATE["celserver"] = srv
    try:
        srv.start()
    except BaseException:
        srv.stop()
        _STATE.pop("celserver", None)
        raise
    try:
        yield srv
    finally:
        _STATE.pop("celserver", None)
        srv.stop()
