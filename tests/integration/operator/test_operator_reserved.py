"""A volume named like one the operator adds, or a mount at one of its paths, on the real control plane: the
operator's webhook refuses it at `kubectl apply` naming the field and the fix; with the webhook off the operator
Rejects the job and creates no pods, instead of creating pods the API server would refuse (duplicate volume name or
mountPath) and leaving the job Pending. A mount at "/etc/grpo/" the API server even accepts (two mounts of one
folder, one hiding the other at run time): the rule compares paths without the trailing slash. The list itself is
derived from the rendered pods in tests/unit/rules/test_reserved.py."""

from __future__ import annotations

import json

import pytest

from grpo_operator.render import manifests
from grpo_operator.rules import validation
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, pods_of, wait_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# (field, the rule's words, its fix, what the API server says of the pod rendered without the rule)
VOLUME = ("spec.template.volumes[0].name", "'config' is the name of a volume the operator adds", "rename it",
          'Duplicate value: "config"')
MOUNT = ("spec.template.volumeMounts[0].mountPath", "/etc/grpo is already mounted by the operator", "mount elsewhere",
         'Invalid value: "/etc/grpo": must be unique')


def reserved_volume(name: str) -> dict:
    job = manifest(name)
    job["spec"]["template"] = {"volumes": [{"name": "config", "emptyDir": {}}]}
    return job


def reserved_mount(name: str) -> dict:
    job = manifest(name)
    job["spec"]["template"] = {"volumes": [{"name": "mine", "emptyDir": {}}],
                               "volumeMounts": [{"name": "mine", "mountPath": "/etc/grpo"}]}
    return job


def test_without_the_webhook_the_operator_rejects_reserved_names(crd, kubectl, k8s_namespace, tmp_path) -> None:
    """First in this module: the module's operator_process fixture registers a webhook for every namespace."""
    k, ns = kubectl, k8s_namespace
    assert not k.exists("validatingwebhookconfiguration", "grpo-operator.grpo.dev"), "a webhook is still registered"
    assert "config" in validation.RESERVED_VOLUMES and "/etc/grpo" in validation.RESERVED_MOUNT_PATHS
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns)
    op.start(wait=False)
    try:
        k.apply([reserved_volume("res-volume"), reserved_mount("res-mount")], "-n", ns)  # nothing refuses it now
        for name, (field, what, fix, server) in (("res-volume", VOLUME), ("res-mount", MOUNT)):
            try:
                st = wait_job(k, ns, name, lambda s: s.get("phase") == "Rejected", timeout=60,
                              what="phase Rejected")["status"]
            except AssertionError:
                print(op.log(60))
                raise
            [c] = [c for c in st["conditions"] if c["type"] == "Rejected"]
            assert c["status"] == "True" and c["reason"] == "InvalidSpec", c
            assert field in c["message"] and what in c["message"] and fix in c["message"], c
            assert st["message"].startswith("invalid spec: ") and field in st["message"], st
            assert not pods_of(k, ns, name)
            n = manifests.names(name)
            assert not k.exists("service", n.service, "-n", ns) and not k.exists("configmap", n.config_map, "-n", ns)
            events = k.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
            assert not [e for e in events if e["reason"] == "FailedCreate"], json.dumps(events)
            # what the rule spares the user: the pod rendered anyway is one the API server refuses (a dry run)
            res = validation.validate(reserved_volume(name) if name == "res-volume" else reserved_mount(name))
            assert res.job is not None and res.topology is not None
            pod = manifests.trainer_pod(res.job, res.topology, ns, 0)
            r = k.create(pod, "-n", ns, "--dry-run=server", check=False)
            assert r.returncode != 0 and server in r.stderr, r.stderr
    finally:
        op.stop()


@pytest.mark.parametrize("make, expected", [(reserved_volume, VOLUME), (reserved_mount, MOUNT)],
                         ids=["volume-name", "mount-path"])
def test_reserved_names_are_refused_by_the_webhook(operator_process, kubectl, k8s_namespace, make,
                                                   expected) -> None:
    field, what, fix, _ = expected
    job = make("reserved")
    r = kubectl.apply([job], "-n", k8s_namespace, check=False)
    assert r.returncode != 0 and "denied the request" in r.stderr, r.stderr
    assert f"{field}: {what}" in r.stderr and fix in r.stderr, r.stderr
    assert not kubectl.exists("grpojob", "reserved", "-n", k8s_namespace)
    job["spec"]["template"] = {}  # the fix: without the collision the same job is admitted
    kubectl.apply([job], "-n", k8s_namespace)
    assert kubectl.exists("grpojob", "reserved", "-n", k8s_namespace)
