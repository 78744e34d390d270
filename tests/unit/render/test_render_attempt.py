"""render() is the whole truth for an attempt: every pod it makes (trainers and the vLLM server) carries the attempt,
its names are the ones the lifecycle expects (manifests.pod_names, also under Kueue), and `grpojob render --attempt N`
prints attempt N."""

from __future__ import annotations

import pytest
import yaml

from grpo_operator.api import gang as g
from grpo_operator.cli import grpojob as cli
from grpo_operator.render import manifests
from grpo_operator.rules import validation
from tests.support.jobs import job_body
from tests.unit.render.test_render_vllm import job as vllm_job


def pods_of(body: dict, attempt: int) -> list[dict]:
    res = validation.validate(body)
    assert res.valid and res.job is not None and res.topology is not None, res.summary()
    objs = manifests.core_objects(res.job, res.topology, "ns", uid="uid-1", attempt=attempt)
    return [o for o in objs if o["kind"] == "Pod"]


@pytest.mark.parametrize("attempt", [0, 3])
def test_every_rendered_pod_carries_its_attempt_and_the_lifecycles_name(attempt: int) -> None:
    body = vllm_job("server", trainer_gpus=1)
    pods = pods_of(body, attempt)
    roles = sorted(p["metadata"]["labels"][manifests.LABEL_ROLE] for p in pods)
    assert roles == [manifests.ROLE_TRAINER, manifests.ROLE_VLLM]
    assert all(p["metadata"]["annotations"][manifests.ANNOTATION_ATTEMPT] == str(attempt) for p in pods)
    job = validation.validate(body).job
    assert job is not None
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(manifests.pod_names(job, 1, attempt))


def test_under_kueue_each_attempt_has_its_own_pod_names_from_the_one_naming_function() -> None:
    body = job_body("job", nodes=2, labels={g.KUEUE_QUEUE_LABEL: "team-a"})
    job = validation.validate(body).job
    assert job is not None
    assert [p["metadata"]["name"] for p in pods_of(body, 0)] == manifests.pod_names(job, 2, 0) == \
        ["job-node-0", "job-node-1"]
    assert [p["metadata"]["name"] for p in pods_of(body, 2)] == manifests.pod_names(job, 2, 2) == \
        ["job-node-0-a2", "job-node-1-a2"]
    assert all(p["spec"]["hostname"] in ("job-node-0", "job-node-1") for p in pods_of(body, 2))  # hostnames stay


def test_grpojob_render_attempt_prints_that_attempt(tmp_path, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_body("job", nodes=2, labels={g.KUEUE_QUEUE_LABEL: "team-a"})))
    assert cli.main(["render", str(path), "--attempt", "2"]) == 0
    pods = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["job-node-0-a2", "job-node-1-a2"]
    assert {p["metadata"]["annotations"][manifests.ANNOTATION_ATTEMPT] for p in pods} == {"2"}
    with pytest.raises(SystemExit) as exc:
        cli.main(["render", str(path), "--attempt", "-1"])
    assert exc.value.code == 2 and "--attempt" in capsys.readouterr().err
