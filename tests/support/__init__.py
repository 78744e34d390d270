"""Helpers and fixtures shared by every tier, imported as `tests.support.X`; the fixture modules are registered as
pytest plugins by tests/conftest.py (no sys.path changes anywhere).

    cluster/   a real control plane (etcd + kube-apiserver), the CEL server, kubectl; fixtures controlplane, kubectl…
    operator   the CRD, the operator as a child process, a kubelet played through pods/status; fixtures crd…
    jobs       GRPOJob manifests and bodies (job_body, pod_body, manifest)
    trainer    trainer config documents, runs under timeouts, offline env; fixtures tiny_config, helpers_on_path
    rewards/   custom reward modules, on PYTHONPATH as a ConfigMap-mounted module would be in a pod
    helm       the helm binary, chart rendering
    oracle     TRL's own GRPOConfig as the batch rule's oracle
"""
