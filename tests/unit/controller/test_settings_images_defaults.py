"""The operator's two trainer images (GRPO_TRAINER_IMAGE / --trainer-image for pods with GPUs, GRPO_TRAINER_CPU_IMAGE /
--trainer-cpu-image for pods without) and its job defaults file (GRPO_JOB_DEFAULTS_FILE / --job-defaults, the
chart's jobDefaults ConfigMap): read and checked at start, a bad file a usage error naming it and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_operator.cli import grpo_operator as main
from grpo_operator.controller import kube
from grpo_operator.render import manifests


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("GRPO_NAMESPACES", "GRPO_ALL_NAMESPACES", "GRPO_TRAINER_IMAGE", "GRPO_TRAINER_CPU_IMAGE",
              "GRPO_JOB_DEFAULTS_FILE", "GRPO_JOB_NETWORK_POLICY"):
        monkeypatch.delenv(k, raising=False)


def test_two_images_defaults_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = main.parse_args(["-n", "a"])
    assert (cfg.image, cfg.cpu_image) == (manifests.DEFAULT_TRAINER_IMAGE, manifests.DEFAULT_CPU_TRAINER_IMAGE)
    monkeypatch.setenv("GRPO_TRAINER_IMAGE", "reg/t:1-cu124")
    monkeypatch.setenv("GRPO_TRAINER_CPU_IMAGE", "reg/t:1-cpu")
    cfg = main.parse_args(["-n", "a"])
    assert (cfg.image, cfg.cpu_image) == ("reg/t:1-cu124", "reg/t:1-cpu")
    cfg = main.parse_args(["-n", "a", "--trainer-image", "x:1", "--trainer-cpu-image", "y:1"])
    assert (cfg.image, cfg.cpu_image) == ("x:1", "y:1")


def test_job_defaults_from_the_env_file_and_the_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert main.parse_args(["-n", "a"]).limits.job_defaults == {}
    env_file = tmp_path / "job-defaults.yaml"
    env_file.write_text("tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]\n")
    monkeypatch.setenv("GRPO_JOB_DEFAULTS_FILE", str(env_file))
    cfg = main.parse_args(["-n", "a"])
    assert cfg.limits.job_defaults == {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    flag_file = tmp_path / "values.yaml"
    flag_file.write_text("jobDefaults:\n  priorityClassName: training\n")
    assert main.parse_args(["-n", "a", "--job-defaults", str(flag_file)]).limits.job_defaults == \
        {"priorityClassName": "training"}


@pytest.mark.parametrize("text, words", [
    ("capabilities: [NET_RAW]\n", ["capabilities", "NET_RAW", "not allowed"]),
    ("terminationGracePeriodSeconds: soon\n", ["terminationGracePeriodSeconds"]),
    (None, ["cannot read it"]),
])
def test_bad_job_defaults_are_a_usage_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path, text: str | None, words: list[str]) -> None:
    path = tmp_path / "d.yaml"
    if text is not None:
        path.write_text(text)
    for argv, env in ((["-n", "a", "--job-defaults", str(path)], False), (["-n", "a"], True)):
        if env:
            monkeypatch.setenv("GRPO_JOB_DEFAULTS_FILE", str(path))
        with pytest.raises(SystemExit) as exc:
            main.parse_args(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "Traceback" not in err and str(path) in err, err
        for word in words:
            assert word in err, err


@pytest.mark.parametrize("info, version", [
    ({"major": "1", "minor": "20"}, (1, 20)),
    ({"major": "1", "minor": "29+"}, (1, 29)),       # EKS, GKE
    ({"major": "", "minor": ""}, (0, 0)),
    ({}, (0, 0)),
])
def test_server_version(info: dict, version: tuple[int, int]) -> None:
    assert kube.server_version(info) == version
