"""Test infrastructure for a real control plane (no dependency on grpo_operator).

- controlplane.ControlPlane: etcd + kube-apiserver 1.20.2 (+ kube-controller-manager 1.20.2)
- celserver.CelServer: etcd + apiextensions-apiserver 1.36 (CEL x-kubernetes-validations)
- kubectl.Kubectl: the real kubectl 1.37 against a kubeconfig
- fixtures: pytest fixtures (``controlplane``, ``kubectl``, ``celserver``, ...)

Binaries come from scripts/install-test-deps.sh (.tools/bin) and Debian's etcd-server.
"""
