"""`grpo-operator` flags (fixed contract) and chart env."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Optional

import pytest

from grpo_operator.cli import grpo_operator as main


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("GRPO_NAMESPACES", "GRPO_ALL_NAMESPACES", "GRPO_WEBHOOK_LISTEN", "GRPO_WEBHOOK_MANAGE", "GRPO_PEERING",
              "GRPO_LOG_FORMAT", "GRPO_TRAINER_IMAGE", "GRPO_SCANNING", "GRPO_JOB_NETWORK_POLICY",
              "GRPO_OPERATOR_NAMESPACE", "GRPO_OPERATOR_POD_LABELS", "GRPO_JOB_NETWORK_POLICY_METRICS_FROM"):
        monkeypatch.delenv(k, raising=False)


def test_fixed_flags() -> None:
    cfg = main.parse_args(["--namespace", "a", "--namespace", "b", "--webhook-listen", "127.0.0.1:9443",
                           "--webhook-host", "h", "--webhook-manage", "--webhook-cert-dir", "/c",
                           "--liveness", "http://0.0.0.0:8080/healthz", "--json-logs"])
    assert cfg.namespaces == ["a", "b"] and not cfg.all_namespaces
    assert (cfg.webhook_listen, cfg.webhook_host, cfg.webhook_manage, cfg.webhook_cert_dir) == ("127.0.0.1:9443", "h", True, "/c")
    assert cfg.liveness == "http://0.0.0.0:8080/healthz" and cfg.json_logs
    assert main.parse_args(["--all-namespaces"]).all_namespaces


def test_env_from_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_NAMESPACES", "x,y")
    monkeypatch.setenv("GRPO_TRAINER_IMAGE", "img:1")
    monkeypatch.setenv("GRPO_LOG_FORMAT", "json")
    monkeypatch.setenv("GRPO_PEERING", "grpo")
    monkeypatch.setenv("GRPO_SCANNING", "0")
    cfg = main.parse_args([])
    assert cfg.namespaces == ["x", "y"] and cfg.image == "img:1" and cfg.json_logs and cfg.peering == "grpo"
    assert not cfg.scanning


def test_job_network_policy_from_chart_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert main.parse_args(["-n", "a"]).network_policy() is None  # off unless told (outside the chart)
    monkeypatch.setenv("GRPO_JOB_NETWORK_POLICY", "true")
    monkeypatch.setenv("GRPO_OPERATOR_NAMESPACE", "grpo-system")
    monkeypatch.setenv("GRPO_OPERATOR_POD_LABELS", "app.kubernetes.io/instance=r,app.kubernetes.io/name=grpo-operator")
    monkeypatch.setenv("GRPO_JOB_NETWORK_POLICY_METRICS_FROM", '[{"namespaceSelector":{"matchLabels":{"n":"mon"}}}]')
    access = main.parse_args(["-n", "a"]).network_policy()
    assert access is not None and access.operator_namespace == "grpo-system"
    assert access.operator_labels == {"app.kubernetes.io/instance": "r", "app.kubernetes.io/name": "grpo-operator"}
    assert access.metrics_from == ({"namespaceSelector": {"matchLabels": {"n": "mon"}}},)


@pytest.mark.parametrize("env, words", [
    ({"GRPO_JOB_NETWORK_POLICY": "1"}, "needs GRPO_OPERATOR_POD_LABELS"),
    ({"GRPO_OPERATOR_POD_LABELS": "app"}, "GRPO_OPERATOR_POD_LABELS='app'"),
    ({"GRPO_JOB_NETWORK_POLICY_METRICS_FROM": "{"}, "GRPO_JOB_NETWORK_POLICY_METRICS_FROM is not JSON"),
    ({"GRPO_JOB_NETWORK_POLICY_METRICS_FROM": '{"a": 1}'}, "a JSON list of NetworkPolicyPeer objects"),
])
def test_bad_network_policy_environment_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str],
                                                         env: dict[str, str], words: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        main.parse_args(["-n", "a"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [[], ["--all-namespaces", "--namespace", "a"], ["-n", "a", "--webhook-manage"]])
def test_bad_flag_combinations(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        main.parse_args(argv)


def test_json_formatter() -> None:
    import json
    import logging

    rec = logging.LogRecord("grpo_operator", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    out = json.loads(main.JsonFormatter().format(rec))
    assert out["message"] == "hello x" and out["level"] == "info" and out["logger"] == "grpo_operator"


@pytest.mark.parametrize("name, value, words", [
    ("GRPO_RESYNC_SECONDS", "soon", "is not a number"),
    ("GRPO_MAX_CONCURRENT_WRITES", "1.5", "is not an integer"),
    ("GRPO_TRAINER_METRICS_PORT", "http", "is not an integer"),
    ("GRPO_FORCE_DELETE_AFTER_SECONDS", "a minute", "seconds or 'off'"),
    ("GRPO_MAX_NODES_PER_JOB", "two", "is not an integer"),
])
def test_bad_environment_is_a_usage_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str],
                                                         name: str, value: str, words: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        main.parse_args([])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{name}={value!r}" in err and words in err and "Traceback" not in err


@pytest.mark.parametrize("name, value, words", [
    ("GRPO_MAX_CONCURRENT_WRITES", "0", "must be >= 1"),
    ("GRPO_MAX_CONCURRENT_WRITES", "-3", "must be >= 1"),
    ("GRPO_RESYNC_SECONDS", "0", "must be > 0"),
    ("GRPO_MAX_NODES_PER_JOB", "0", "must be >= 1"),
])
def test_out_of_range_environment_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str],
                                                   name: str, value: str, words: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        main.parse_args(["--namespace", "a"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert name in err and words in err and "Traceback" not in err


@pytest.mark.parametrize("kubeconfig, words", [
    (None, "no Kubernetes credentials"),
    ("missing", "FileNotFoundError"),
    ("garbage", "cannot use the Kubernetes credentials"),
])
def test_no_or_broken_credentials_is_one_line_and_exit_1(tmp_path: Any, kubeconfig: Optional[str], words: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    if kubeconfig is not None:
        path = tmp_path / "kc"
        if kubeconfig == "garbage":
            path.write_text("garbage: [\n")
        env["KUBECONFIG"] = str(path)
    cp = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpo_operator", "--namespace", "x"], env=env,
                        capture_output=True, text=True, timeout=60)
    err = cp.stderr.strip().splitlines()
    assert cp.returncode == 1, cp.stderr
    assert err[-1].startswith("grpo-operator: error: ") and words in err[-1], err
    assert "Traceback" not in cp.stderr and len(err) <= 2, err  # the start line, then the reason
