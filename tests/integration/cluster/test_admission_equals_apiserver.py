"""Admission equals the API server: every mutation of a realistic spec that `grpojob check` accepts renders objects
(render(), as the operator does) that the real kube-apiserver accepts with dryRun=All — the job itself and every
child — and what check refuses is refused for a plausible reason.

Finding (issue 26): of 300 such mutations check accepted 208, and the API server refused the objects of 97 of those
(annotation keys over 63 characters, volume names that are not DNS labels, a toleration with operator Exists and a
value, invalid nodeSelector keys, GPU requests without limits, a mount naming no volume…)."""

from __future__ import annotations

import collections
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from grpo_operator.render.job import render
from grpo_operator.rules import validation
from tests.support.cluster.util import wait_until
from tests.support.spec_mutations import MUTATIONS, mutated_jobs

pytestmark = [pytest.mark.timeout(300)]

SEED = 26
COUNT = 400

_PATHS = {"Pod": "/api/v1/namespaces/{ns}/pods", "Service": "/api/v1/namespaces/{ns}/services",
          "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
          "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
          "GRPOJob": "/apis/grpo.dev/v1alpha1/namespaces/{ns}/grpojobs"}


def _dry_run(cp: Any, ns: str, obj: dict[str, Any]) -> tuple[int, str]:
    r = cp.api("POST", _PATHS[obj["kind"]].format(ns=ns) + "?dryRun=All", obj)
    return r.status, r.message if r.status >= 300 else ""


def test_every_spec_check_accepts_is_accepted_by_the_api_server(crd, k8s_namespace) -> None:
    cp, ns = crd, k8s_namespace
    wait_until(lambda: cp.api("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default").status == 200, 60, 0.1,
               what="the namespace's default ServiceAccount")  # pods need it, even in a dry run
    accepted: list[tuple[list[str], list[dict[str, Any]]]] = []
    refused: dict[str, list[str]] = collections.defaultdict(list)  # mutation → check's messages
    for i, (names, doc) in enumerate(mutated_jobs(COUNT, SEED)):
        res = validation.validate(doc)
        if not res.valid:
            if len(names) == 1:
                refused[names[0]] = [f"{e.field}: {e.message}" for e in res.errors]
            continue
        assert res.job is not None and res.topology is not None
        uid = str(uuid.UUID(int=i))
        objs = render(res.job, res.topology, ns, uid=uid)
        accepted.append((names, [{**doc, "metadata": {**doc["metadata"], "namespace": ns}}, *objs]))
    jobs = [(names, obj) for names, objs in accepted for obj in objs]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda pair: _dry_run(cp, ns, pair[1]), jobs))
    refused_by_server = [(names, obj["kind"], obj["metadata"]["name"], status, message)
                         for (names, obj), (status, message) in zip(jobs, answers, strict=True) if status >= 300]
    assert not refused_by_server, "\n".join(map(str, refused_by_server[:20]))
    # the count the measurement compares with, and plausible refusals: every single mutation below breaks a
    # rule of the API server (or of the job), and check names the field it broke
    singles_refused = set(refused)
    expected_refused = {name for name in MUTATIONS if _breaks_a_rule(name)}
    assert expected_refused <= singles_refused, sorted(expected_refused - singles_refused)
    wrongly = sorted(singles_refused - expected_refused)
    assert not wrongly, {name: refused[name] for name in wrongly}
    total = COUNT
    print(f"\n{len(accepted)} of {total} accepted, {len(jobs)} objects created with dryRun=All, 0 refused by the "
          f"API server; {total - len(accepted)} refused by check")
    assert len(accepted) > total // 4 and total - len(accepted) > total // 4


# Single mutations that are wrong: for the API server (or for the job: more GPUs than a node has, an unsupported
# accelerator, a name that is not one); everything else is a valid spec that check must accept.
_WRONG = (
    "gpu requests only", "gpu requests below limits", "gpu 17", "gpu 1024", "cpu request over limit",
    "memory lowercase unit", "memory negative", "rdma requests only", "extended fraction", "hugepages requests differ",
    "unknown plain resource", "mig two", "amd", "volume uppercase name", "volume long name", "volume bad sizeLimit",
    "volume bad medium", "volume pvc no claim", "volume pvc bad claim", "volume two sources", "volume no source",
    "volume typo source", "volume hostPath relative", "volume secret no name", "volume reserved name",
    "volume duplicate", "mount missing volume", "mount relative path", "mount subPath up", "mount duplicate path",
    "mount readOnly string", "mount bidirectional", "mount reserved path", "mount no name", "env dotdot", "env both",
    "env bad fieldRef", "env secret no key", "env configMap bad name", "env empty valueFrom", "env two refs",
    "label long name", "label long value", "label bad value", "label uppercase prefix", "label slash value",
    "label two slashes", "label dash end", "annotation long name", "annotation long prefix", "annotation space",
    "annotations over 256KiB", "toleration exists with value", "toleration empty key equal",
    "toleration seconds wrong effect", "toleration operator In", "toleration bad effect", "toleration bad key",
    "toleration typo", "toleration long value", "selector space key", "selector long value", "selector slash value",
    "selector bad prefix", "shm lots", "shm -1Gi", "image Bad Image", "name Bad_Name", "name -bad",
    "vllm server requests only", "token bad key", "token bad name",
)


def _breaks_a_rule(name: str) -> bool:
    return name in _WRONG
