"""Where a GRPOClient connects: a kube-config file (and context) or, in a pod, the in-cluster configuration."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import yaml

from .errors import ConfigError

SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def load_config(context: Optional[str], config_file: Optional[str]) -> tuple[Any, Optional[str]]:
    """The kube-config (or the in-cluster configuration) → (Configuration, its default namespace)."""
    from kubernetes import client as k8s
    from kubernetes import config as kconfig

    cfg = k8s.Configuration()
    files = config_file or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    have_file = any(Path(p).expanduser().is_file() for p in files.split(os.pathsep) if p)
    if config_file is not None and not have_file:
        raise ConfigError(f"kube-config {config_file} does not exist")
    if not have_file and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            kconfig.load_incluster_config(client_configuration=cfg)
        except kconfig.ConfigException as exc:
            raise ConfigError(f"in-cluster configuration: {exc}") from None
        try:
            ns = Path(SA_NAMESPACE).read_text().strip() or None
        except OSError:
            ns = None
        return cfg, ns
    if not have_file:
        raise ConfigError(f"no kube-config: {files} does not exist and this is not a pod "
                          "(set KUBECONFIG, pass --kubeconfig/config_file, or run in a cluster)")
    try:
        # `files`, not None: the kubernetes package reads $KUBECONFIG once, when it is imported
        kconfig.load_kube_config(config_file=files, context=context, client_configuration=cfg)
        contexts, active = kconfig.list_kube_config_contexts(config_file=files)
    except kconfig.ConfigException as exc:
        raise ConfigError(f"kube-config {files}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"kube-config {files}: {type(exc).__name__}: {exc}") from None
    chosen = next((x for x in contexts or [] if x.get("name") == context), None) if context else active
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    return cfg, ns
