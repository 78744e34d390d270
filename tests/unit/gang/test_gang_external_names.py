"""The label, annotation, gate, finalizer and condition names the operator uses for Kueue, coscheduling and
Volcano are the ones those projects define: parsed from their Go sources, checked in under fixtures/ (each file
names its repository, commit and path)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grpo_operator.api import gang as g

FIXTURES = Path(__file__).parent / "fixtures"
_CONST = re.compile(r"^\s*(?:const\s+)?([A-Za-z][A-Za-z0-9_]*)\s*(?:[A-Za-z.]+\s*)?=\s*(.+?)\s*$")


def go_constants(*files: str) -> dict[str, str]:
    """`Name = "value"`, `Name = Other` and `Name = pkg.Other + "/suffix"` lines of Go sources, resolved."""
    raw: dict[str, str] = {}
    for f in files:
        for line in (FIXTURES / f).read_text().splitlines():
            m = _CONST.match(line)
            if m:
                raw[m.group(1)] = m.group(2)
    out: dict[str, str] = {}

    def resolve(expr: str) -> str:
        parts = [p.strip() for p in expr.split("+")]
        value = ""
        for p in parts:
            if p.startswith('"'):
                value += p.strip('"')
            else:
                value += resolve(raw[p.rsplit(".", 1)[-1]])
        return value

    for name, expr in raw.items():
        try:
            out[name] = resolve(expr)
        except KeyError:
            pass  # typed constants of other packages we do not need
    return out


KUEUE = ("kueue-v0.19.2-pkg_controller_jobs_pod_constants_constants.go", "kueue-v0.19.2-pkg_constants_constants.go",
         "kueue-v0.19.2-pkg_controller_constants_constants.go", "kueue-v0.19.2-pod_controller-excerpt.go")


@pytest.mark.parametrize("ours, theirs", [
    (g.KUEUE_QUEUE_LABEL, "QueueLabel"),
    (g.KUEUE_PRIORITY_CLASS_LABEL, "WorkloadPriorityClassLabel"),
    (g.KUEUE_MANAGED_LABEL, "ManagedByKueueLabelKey"),
    (g.KUEUE_POD_FINALIZER, "PodFinalizer"),
    (g.KUEUE_GROUP_NAME_LABEL, "GroupNameLabel"),
    (g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION, "GroupTotalCountAnnotation"),
    (g.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION, "RetriableInGroupAnnotationKey"),
    (g.KUEUE_RETRIABLE_IN_GROUP_FALSE, "RetriableInGroupAnnotationValue"),
    (g.KUEUE_ADMISSION_GATE, "SchedulingGateName"),
    (g.KUEUE_ROLE_HASH_ANNOTATION, "RoleHashAnnotation"),
    (g.KUEUE_TERMINATION_TARGET, "ConditionTypeTerminationTarget"),
])
def test_kueue_names(ours: str, theirs: str) -> None:
    assert go_constants(*KUEUE)[theirs] == ours


def test_kueue_prefixes_cover_every_kueue_key() -> None:
    """What Kueue writes onto pods is recognised by prefix: every pod-level key Kueue defines starts with one."""
    consts = go_constants(*KUEUE)
    keys = [v for v in consts.values() if "/" in v and "." in v.split("/")[0]]
    assert len(keys) > 15
    assert all(k.startswith(g.KUEUE_PREFIXES) for k in keys), [k for k in keys if not k.startswith(g.KUEUE_PREFIXES)]


def test_the_operator_passes_only_the_queue_labels_through() -> None:
    from grpo_operator.render import manifests
    assert set(manifests.PASS_THROUGH_LABELS) == {g.KUEUE_QUEUE_LABEL, g.KUEUE_PRIORITY_CLASS_LABEL}


def test_coscheduling_names() -> None:
    consts = go_constants("scheduler-plugins-excerpt.go")
    assert consts["PodGroupLabel"] == g.COSCHEDULING_POD_GROUP_LABEL
    assert g.COSCHEDULING_API_VERSION == f"{consts['GroupName']}/v1alpha1"


def test_volcano_names() -> None:
    consts = go_constants("volcano-excerpt.go")
    assert consts["KubeGroupNameAnnotationKey"] == g.VOLCANO_GROUP_NAME_ANNOTATION
    assert consts["defaultSchedulerName"] == g.VOLCANO_SCHEDULER_NAME
    assert g.VOLCANO_API_VERSION == f"{consts['GroupName']}/v1beta1"


def test_the_parser_reads_what_it_must() -> None:
    """A guard on the guard: the parser finds the constants by name, and a changed value would be seen."""
    consts = go_constants(*KUEUE)
    assert consts["GroupNameLabel"] == "kueue.x-k8s.io/pod-group-name"
    assert consts["PodFinalizer"] == consts["ManagedByKueueLabelKey"] == "kueue.x-k8s.io/managed"
