"""Gang scheduling on the real control plane (kube-apiserver + etcd + controller-manager, no scheduler, no kubelet,
no Kueue): the real PodGroup CRDs of scheduler-plugins and Volcano installed, the operator's PodGroups accepted by
the API server as rendered, and the operator's behaviour around them and around Kueue's pod finalizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator.api import gang as g
from grpo_operator.render import manifests
from grpo_operator.rules import validation
from tests.support.cluster.util import wait_until

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[2] / "unit" / "gang" / "fixtures"
POD_GROUP_CRDS = {"podgroups.scheduling.x-k8s.io": FIXTURES / "scheduling.x-k8s.io_podgroups.yaml",
                  "podgroups.scheduling.volcano.sh": FIXTURES / "scheduling.volcano.sh_podgroups.yaml"}


def install_pod_group_crds(k: Any) -> None:
    for _name, path in POD_GROUP_CRDS.items():
        k("apply", "--validate=false", "-f", str(path))

    def established() -> bool:
        for name in POD_GROUP_CRDS:
            c = k.json("get", "crd", name)
            if not any(x.get("type") == "Established" and x.get("status") == "True"
                       for x in (c.get("status") or {}).get("conditions") or []):
                return False
        return True

    wait_until(established, 30, 0.1, what="PodGroup CRDs Established")


@pytest.fixture(scope="module")
def pod_group_crds(controlplane: Any) -> Any:
    install_pod_group_crds(controlplane.kubectl)
    return controlplane


def job_body(name: str, ns: str, **spec_over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": {"name": "openai/gsm8k"}, "rewards": [{"name": "accuracy"}],
        "nodes": 2, "resources": {"limits": {"cpu": "2", "memory": "4Gi"}}, "vllm": {"mode": "none"},
        "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 4, "maxSteps": 10},
        "runPolicy": {"backoffLimit": 3},
    }
    spec.update(spec_over)
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


@pytest.mark.parametrize("gang", ["coscheduling", "volcano"])
def test_rendered_pod_groups_are_stored_as_rendered(pod_group_crds: Any, kubectl: Any, k8s_namespace: str,
                                                    gang: str) -> None:
    """The API server (the real CRD schemas, structural: unknown fields pruned, types enforced) stores the
    rendered PodGroup's spec unchanged."""
    scheduling: dict[str, Any] = {"gang": gang}
    scheduling.update({"scheduleTimeoutSeconds": 60} if gang == "coscheduling" else {"queue": "research"})
    res = validation.validate(job_body("pg", k8s_namespace, scheduling=scheduling))
    assert res.valid, res.summary()
    objs = manifests.core_objects(res.job, res.topology, k8s_namespace)
    pg = next(o for o in objs if o["kind"] == "PodGroup")
    assert objs.index(pg) < min(i for i, o in enumerate(objs) if o["kind"] == "Pod")  # created before the pods
    kubectl.create(pg, validate=False)
    plural = "podgroups.scheduling.x-k8s.io" if gang == "coscheduling" else "podgroups.scheduling.volcano.sh"
    stored = kubectl.json("get", plural, pg["metadata"]["name"], "-n", k8s_namespace)
    assert stored["apiVersion"] == pg["apiVersion"]
    assert stored["spec"] == pg["spec"], json.dumps(stored["spec"])
    assert stored["spec"]["minMember"] == 2
    assert stored["spec"]["minResources"] == {"cpu": "4", "memory": "8Gi"}


def test_the_api_server_refuses_what_the_crd_forbids(pod_group_crds: Any, kubectl: Any, k8s_namespace: str) -> None:
    """A guard on the test above: the installed schema is enforced (minMember ≥ 1 in scheduler-plugins)."""
    bad = {"apiVersion": g.COSCHEDULING_API_VERSION, "kind": "PodGroup",
           "metadata": {"name": "bad", "namespace": k8s_namespace}, "spec": {"minMember": 0}}
    out = kubectl("create", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert out.returncode != 0 and "minMember" in (out.stderr + out.stdout)


# ------------------------------------------------------------------------------------------ Kueue, played
class KueueAndNode:
    """What the operator must live with under Kueue's pod integration, played over the API on the real control
    plane (Kueue v0.19.2, pkg/controller/jobs/pod): the finalizer kueue.x-k8s.io/managed and the managed label its
    webhook puts on every pod of a group (here right after creation), and the rule by which it takes the finalizer
    off again — an inactive pod (Failed, or deleted before it was scheduled) keeps it until enough active
    replacements of its group exist, or until the group has ended (every pod terminated and one carries
    retriable-in-group: "false"). A group with more active pods than its total count is recorded as excess
    (Kueue would delete the newest pods: ExcessPodDeleted). Plus a node: it binds new pods, runs them, and on
    deletion ends them the way the trainer does on SIGTERM (exit 143, phase Failed) before the kubelet's final
    delete (grace 0). With `whole_groups`, also Kueue's admission: a group's pods are bound only once the group has
    its total count of active pods (Kueue composes the group's Workload only then, and keeps the pods gated until it
    is admitted). A running vLLM server pod answers on loopback (its pod IP), where the test's stand-in engine is."""

    NODE = "gang-node-1"

    def __init__(self, cp: Any, ns: str, whole_groups: bool = False):
        self.cp, self.ns = cp, ns
        self.excess: list[str] = []
        self.finalized: list[str] = []
        self.auto_run = True
        self.whole_groups = whole_groups
        self.seen: list[list[tuple[str, str]]] = []  # per step where a pod first appears: (pod, phase) of every pod

    def _pods(self) -> list[dict[str, Any]]:
        r = self.cp.api("GET", f"/api/v1/namespaces/{self.ns}/pods?labelSelector={g.KUEUE_GROUP_NAME_LABEL}")
        assert r.ok, r.message
        return r.body["items"]

    def _patch(self, name: str, body: Any, sub: str = "") -> None:
        r = self.cp.api("PATCH", f"/api/v1/namespaces/{self.ns}/pods/{name}{sub}", body,
                        content_type="application/merge-patch+json")
        assert r.ok or r.status == 404, r.message

    def _complete(self, pods: list[dict[str, Any]]) -> set[str]:
        """The groups with at least their total count of active pods (Kueue's Workload can be composed)."""
        counts: dict[str, list[int]] = {}
        for p in pods:
            meta = p["metadata"]
            c = counts.setdefault(meta["labels"][g.KUEUE_GROUP_NAME_LABEL],
                                  [0, int(meta["annotations"][g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION])])
            c[0] += (p.get("status") or {}).get("phase") != "Failed" and not meta.get("deletionTimestamp")
        return {group for group, (active, total) in counts.items() if active >= total}

    def step(self) -> None:
        pods = self._pods()
        known = {n for step in self.seen for n, _ in step}
        if any(p["metadata"]["name"] not in known for p in pods):
            self.seen.append(sorted((p["metadata"]["name"], (p.get("status") or {}).get("phase") or "Pending")
                                    for p in pods))
        complete = self._complete(pods)
        for p in pods:
            meta, name = p["metadata"], p["metadata"]["name"]
            if g.KUEUE_POD_FINALIZER not in (meta.get("finalizers") or []) and not meta.get("deletionTimestamp") \
                    and meta["name"] not in self.finalized:
                self._patch(name, {"metadata": {"finalizers": [g.KUEUE_POD_FINALIZER],
                                                "labels": {g.KUEUE_MANAGED_LABEL: "true"}}})
            admitted = not self.whole_groups or meta["labels"][g.KUEUE_GROUP_NAME_LABEL] in complete
            if not p["spec"].get("nodeName") and not meta.get("deletionTimestamp") and admitted:
                r = self.cp.api("POST", f"/api/v1/namespaces/{self.ns}/pods/{name}/binding",
                                {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                 "target": {"apiVersion": "v1", "kind": "Node", "name": self.NODE}})
                assert r.ok or r.status in (404, 409), r.message
            phase = (p.get("status") or {}).get("phase")
            if meta.get("deletionTimestamp") and p["spec"].get("nodeName") and phase not in ("Failed", "Succeeded"):
                self.end(name, 143)
            elif meta.get("deletionTimestamp") and phase in ("Failed", "Succeeded") \
                    and meta.get("deletionGracePeriodSeconds") != 0:
                self.cp.api("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}",
                            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
            elif self.auto_run and p["spec"].get("nodeName") and phase == "Pending" and not meta.get("deletionTimestamp"):
                server = meta["labels"].get(manifests.LABEL_ROLE) == "vllm-server"
                self._patch(name, {"status": {"phase": "Running", "conditions": [
                    {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                    **({"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]} if server else {})}}, "/status")
        groups: dict[str, list[dict[str, Any]]] = {}
        for p in pods:
            groups.setdefault(p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL], []).append(p)
        for group, members in groups.items():
            total = int(members[0]["metadata"]["annotations"][g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION])
            phase = [(m.get("status") or {}).get("phase") for m in members]
            active = [m for m, ph in zip(members, phase, strict=False) if ph != "Failed"
                      and not (m["metadata"].get("deletionTimestamp") and not m["spec"].get("nodeName"))]
            inactive = [m for m in members if m not in active]
            if len(active) > total:
                self.excess.append(f"{group}: {sorted(m['metadata']['name'] for m in active)}")
            ended = all(ph in ("Failed", "Succeeded") for ph in phase) and any(
                (m["metadata"].get("annotations") or {}).get(g.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION) == "false"
                for m in members)
            n = len(members) if ended else min(len(inactive), len(inactive) + len(active) - total)
            for m in (members if ended else inactive)[:max(n, 0)]:
                if g.KUEUE_POD_FINALIZER in (m["metadata"].get("finalizers") or []):
                    self.finalized.append(m["metadata"]["name"])
                    self._patch(m["metadata"]["name"], {"metadata": {"finalizers": None}})

    def end(self, name: str, code: int) -> None:
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "startedAt": "2030-01-01T00:00:00Z", "finishedAt": "2030-01-01T00:00:00Z"}
        self._patch(name, {"status": {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
            {"name": "trainer", "ready": False, "restartCount": 0, "image": "grpo-trainer", "imageID": "",
             "state": {"terminated": term}}]}}, "/status")

    def run_until(self, pred: Any, timeout: float, what: str) -> Any:
        def tick() -> Any:
            self.step()
            return pred()
        return wait_until(tick, timeout, 0.2, what=what)


def _status(k: Any, ns: str, name: str) -> dict[str, Any]:
    return (k.json("get", "grpojob", name, "-n", ns).get("status") or {})


def _live(k: Any, ns: str, job: str) -> list[dict[str, Any]]:
    items = k.json("get", "pods", "-n", ns, "-l", f"{manifests.LABEL_JOB}={manifests.names(job).base}")["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def test_kueue_gang_restart_under_kueues_finalizer(operator_process: Any, controlplane: Any, kubectl: Any,
                                                   k8s_namespace: str) -> None:
    """Delete → wait until the old pods are Failed → create replacements with new names in the same group: no
    deadlock on Kueue's finalizer (the old pods never go before their replacements exist), never more active
    pods than the group's count, and the rendezvous hostnames unchanged."""
    k, ns = kubectl, k8s_namespace
    body = job_body("kq", ns)
    body["metadata"]["labels"] = {g.KUEUE_QUEUE_LABEL: "lq"}
    k.apply(body)
    sim = KueueAndNode(controlplane, ns)
    sim.run_until(lambda: _status(k, ns, "kq").get("phase") == "Running", 60, "attempt 0 running")
    first = _live(k, ns, "kq")
    assert [p["metadata"]["name"] for p in first] == ["kq-node-0", "kq-node-1"]
    group = {p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL] for p in first}
    assert len(group) == 1 and {p["metadata"]["annotations"][g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION] for p in first} == {"2"}

    sim.end("kq-node-1", 137)  # a retryable failure: gang restart
    sim.run_until(lambda: (_status(k, ns, "kq").get("phase") == "Running" and _status(k, ns, "kq").get("restarts") == 1),
                  90, "attempt 1 running")
    now = _live(k, ns, "kq")
    assert [p["metadata"]["name"] for p in now] == ["kq-node-0-a1", "kq-node-1-a1"]  # the old ones were finalized
    assert {p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL] for p in now} == group  # replacements: same group
    assert [(p["spec"]["hostname"], p["spec"]["subdomain"]) for p in now] == [("kq-node-0", "kq"), ("kq-node-1", "kq")]
    assert {p["metadata"]["labels"].get("grpo.dev/attempt") or p["metadata"]["annotations"]["grpo.dev/attempt"]
            for p in now} == {"1"}
    assert sorted(sim.finalized) == ["kq-node-0", "kq-node-1"]
    assert sim.excess == []

    # deleting the job ends its group (one pod marked retriable-in-group=false), so Kueue lets every pod go
    k("delete", "grpojob", "kq", "-n", ns, "--wait=false")
    sim.run_until(lambda: not _live(k, ns, "kq"), 60, "the deleted job's pods finalized and gone")
    assert sorted(sim.finalized) == ["kq-node-0", "kq-node-0-a1", "kq-node-1", "kq-node-1-a1"]
    assert sim.excess == []


# ------------------------------------------------------------------------------------------ PodGroups, by the operator
PLURALS = {"coscheduling": "podgroups.scheduling.x-k8s.io", "volcano": "podgroups.scheduling.volcano.sh"}


def _events(k: Any, ns: str, name: str) -> list[dict[str, Any]]:
    return k.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]


def test_without_the_crd_no_pods_and_the_job_says_why(crd: Any, operator_process: Any, kubectl: Any,
                                                       k8s_namespace: str) -> None:
    """Coscheduling's Permit rejects a pod whose PodGroup is missing: no PodGroup, no pods; once the CRD is there,
    the PodGroup and then the pods are created (the operator retries)."""
    k, ns = kubectl, k8s_namespace
    k("delete", "crd", PLURALS["coscheduling"], "--ignore-not-found", "--wait=true")
    k.apply(job_body("early", ns, scheduling={"gang": "coscheduling"}))
    evs = wait_until(lambda: [e for e in _events(k, ns, "early") if e["reason"] == "PodGroupNotCreated"], 60, 0.5,
                     what="a PodGroupNotCreated event")
    assert evs[0]["type"] == "Warning" and "rbac.podGroups" in evs[0]["message"], evs[0]
    assert _live(k, ns, "early") == []
    install_pod_group_crds(k)
    pods = wait_until(lambda: [p for p in _live(k, ns, "early")] or None, 60, 0.5, what="pods after the CRD")
    pg = k.json("get", PLURALS["coscheduling"], "early", "-n", ns)
    assert int(pg["metadata"]["resourceVersion"]) < min(int(p["metadata"]["resourceVersion"]) for p in pods)


@pytest.mark.parametrize("gang", ["coscheduling", "volcano"])
def test_the_pod_group_comes_first_is_owned_and_outlives_a_gang_restart(pod_group_crds: Any, operator_process: Any,
                                                                         kubectl: Any, k8s_namespace: str,
                                                                         gang: str) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(job_body("pgj", ns, scheduling={"gang": gang}))
    pods = wait_until(lambda: (lambda ps: ps if len(ps) == 2 else None)(_live(k, ns, "pgj")), 60, 0.2,
                      what="2 pods")
    job = k.json("get", "grpojob", "pgj", "-n", ns)
    pg = k.json("get", PLURALS[gang], "pgj", "-n", ns)
    ref = pg["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("GRPOJob", job["metadata"]["uid"], True)
    assert pg["spec"]["minMember"] == 2 and pg["spec"]["minResources"] == {"cpu": "4", "memory": "8Gi"}
    # created first: etcd's revision (resourceVersion) orders the writes; nothing updates these objects here
    assert int(pg["metadata"]["resourceVersion"]) < min(int(p["metadata"]["resourceVersion"]) for p in pods)
    for p in pods:
        if gang == "coscheduling":
            assert p["metadata"]["labels"][g.COSCHEDULING_POD_GROUP_LABEL] == "pgj"
        else:
            assert p["metadata"]["annotations"][g.VOLCANO_GROUP_NAME_ANNOTATION] == "pgj"
            assert p["spec"]["schedulerName"] == "volcano"
    # a gang restart keeps the PodGroup (the old pods are gone before the new ones come: no pod here has a
    # finalizer, so that is at once)
    from tests.support.operator import pod_exit, pod_running, wait_pods
    for p in pods:
        pod_running(k, ns, p["metadata"]["name"])
    pod_exit(k, ns, "pgj-node-1", 137)
    wait_pods(k, ns, "pgj", 2, attempt=1, timeout=60)
    assert k.json("get", PLURALS[gang], "pgj", "-n", ns)["metadata"]["uid"] == pg["metadata"]["uid"]
    # deleting the job deletes its PodGroup (the garbage collector, through the owner reference)
    k("delete", "grpojob", "pgj", "-n", ns, "--wait=false")
    wait_until(lambda: not k.exists(PLURALS[gang], "pgj", "-n", ns), 60, 0.5, what="PodGroup garbage-collected")


def test_kueue_eviction_is_not_a_failure(operator_process: Any, controlplane: Any, kubectl: Any,
                                         k8s_namespace: str) -> None:
    """Kueue preempts the group (TerminationTarget on each pod, then deletes them): the job, with no restart left
    to spend, recreates its pods as replacements in the same group instead of failing."""
    k, ns = kubectl, k8s_namespace
    body = job_body("ke", ns)
    body["metadata"]["labels"] = {g.KUEUE_QUEUE_LABEL: "lq"}
    body["spec"]["runPolicy"]["backoffLimit"] = 0
    k.apply(body)
    sim = KueueAndNode(controlplane, ns)
    sim.run_until(lambda: _status(k, ns, "ke").get("phase") == "Running", 60, "attempt 0 running")
    group = {p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL] for p in _live(k, ns, "ke")}
    for name in ("ke-node-0", "ke-node-1"):  # what Kueue's Stop() does (pod_controller.go)
        sim._patch(name, {"status": {"conditions": [{"type": g.KUEUE_TERMINATION_TARGET, "status": "True",
                                                     "reason": "WorkloadEvicted", "message": "Preempted",
                                                     "lastTransitionTime": "2030-01-01T00:00:00Z"}]}}, "/status")
        r = controlplane.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
        assert r.ok, r.message

    def requeued_and_running() -> bool:
        st = _status(k, ns, "ke")
        return st.get("phase") == "Running" and st.get("restarts") == 1 and st.get("requeues") == 1

    sim.run_until(requeued_and_running, 90, "attempt 1 running after the eviction")
    now = _live(k, ns, "ke")
    assert [p["metadata"]["name"] for p in now] == ["ke-node-0-a1", "ke-node-1-a1"]
    assert {p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL] for p in now} == group
    st = _status(k, ns, "ke")
    assert not any(c["type"] == "Failed" for c in st["conditions"]) and "lastFailureReason" not in st
    evs = wait_until(lambda: [e for e in _events(k, ns, "ke") if e["reason"] == "Restarting"], 30, 0.5,
                     what="the Restarting event")
    assert "Kueue evicted the pods" in evs[0]["message"] and "not counted" in evs[0]["message"], evs[0]
    assert sim.excess == []
