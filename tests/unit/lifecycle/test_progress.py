"""Unit tests (no cluster, no training): metrics text → status.progress, the rank-0 pod, whom to scrape, the write
rate limit, merge patches, the operator's metrics, the trainer's callback/metrics, the manifests and the CLI bar."""

from __future__ import annotations

import io
import json
import math
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from grpo_operator.cli.local_run import progress_line
from grpo_operator.controller import metrics as opmetrics
from grpo_operator.lifecycle import progress as pg
from grpo_operator.render import manifests
from grpo_operator.rules import validation
from grpo_operator.webhook.review import reason_label, review
from grpo_trainer.metrics import TrainerMetrics
from tests.support.jobs import manifest

RECORD = {"step": 120, "maxSteps": 500, "reward": 0.6123456789, "rewardStd": 0.25, "kl": None,
          "completionLength": 180.5, "learningRate": 1e-6, "loss": 0.01, "epoch": 0.5,
          "rewards": {"accuracy": 0.5, "format": 0.8}, "rewardStds": {"accuracy": 0.5, "format": 0.1},
          "tokensPerSecond": 2048.0, "etaSeconds": 3601.4, "timestamp": 1_900_000_000.0}


def trainer_text(rank0: bool = True, record=RECORD, **info) -> str:
    m = TrainerMetrics(global_rank0=rank0, **info)
    if record is not None:
        m.update(record)
    return m.text()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


# ------------------------------------------------------------------------------------------ trainer metrics
def test_trainer_metrics_text_parses_and_nan_for_unknown() -> None:
    fams = families(trainer_text(job="j", namespace="ns", attempt="2", pod="j-node-1", node_rank="1"))
    assert fams["grpo_trainer_global_rank0"].samples[0].value == 1
    assert fams["grpo_trainer_step"].samples[0].value == 120
    assert math.isnan(fams["grpo_trainer_kl"].samples[0].value)  # TRL logs no KL with beta 0: NaN, not a fake 0
    rewards = {s.labels["reward"]: s.value for s in fams["grpo_trainer_reward_function_mean"].samples}
    assert rewards == {"accuracy": 0.5, "format": 0.8}
    (info,) = fams["grpo_trainer"].samples if "grpo_trainer" in fams else fams["grpo_trainer_info"].samples
    assert info.labels == {"grpojob": "j", "grpojob_namespace": "ns", "attempt": "2", "node_rank": "1",
                           "pod_name": "j-node-1"}


def test_non_rank0_process_serves_only_its_identity() -> None:
    fams = families(trainer_text(rank0=False))
    assert fams["grpo_trainer_global_rank0"].samples[0].value == 0
    assert "grpo_trainer_step" not in fams  # no second series of training gauges per job


# ------------------------------------------------------------------------------------------ text → progress
def test_metrics_text_to_progress() -> None:
    s = pg.parse_metrics(trainer_text(), "j-node-1")
    assert s.global_rank0 is True and s.pod == "j-node-1"
    p = pg.to_progress(s)
    assert p == {"step": 120, "maxSteps": 500, "display": "120/500", "reward": 0.612346, "rewardStd": 0.25,
                 "rewards": {"accuracy": 0.5, "format": 0.8}, "completionLength": 180.5, "learningRate": 1e-6,
                 "tokensPerSecond": 2048.0, "etaSeconds": 3601, "updateTime": "2030-03-17T17:46:40Z"}
    assert "kl" not in p  # NaN is missing, not 0


def test_missing_and_nan_values() -> None:
    text = ("# TYPE grpo_trainer_global_rank0 gauge\ngrpo_trainer_global_rank0 1\n"
            "grpo_trainer_step 7\ngrpo_trainer_max_steps NaN\ngrpo_trainer_reward_mean +Inf\n"
            'grpo_trainer_reward_function_mean{reward="accuracy"} NaN\n')
    p = pg.to_progress(pg.parse_metrics(text))
    assert p == {"step": 7, "display": "7"}
    # a trainer still loading its model: rank known, no step yet → no progress at all
    assert pg.to_progress(pg.parse_metrics(trainer_text(record=None))) is None


def test_garbage_is_a_parse_error() -> None:
    with pytest.raises(pg.MetricsParseError):
        pg.parse_metrics("<html>not metrics{</html>\n")


def test_rank0_is_whichever_pod_says_so() -> None:
    node0 = pg.parse_metrics(trainer_text(rank0=False), "j-node-0")
    node1 = pg.parse_metrics(trainer_text(rank0=True), "j-node-1")
    node2 = pg.parse_metrics(trainer_text(rank0=False), "j-node-2")
    assert pg.choose_rank0([node0, node1, node2]).pod == "j-node-1"  # c10d may give rank 0 to any node
    assert pg.choose_rank0([node0, node2]) is None
    assert pg.choose_rank0([]) is None
    # two claimants (a stale pod still answering): the one that logged last
    later = pg.parse_metrics(trainer_text(record={**RECORD, "timestamp": RECORD["timestamp"] + 60}), "j-node-2")
    assert pg.choose_rank0([node1, later]).pod == "j-node-2"
    # an image without the rank gauge: the only pod with a step
    bare = pg.parse_metrics("grpo_trainer_step 3\n", "j-node-0")
    assert pg.choose_rank0([bare]).pod == "j-node-0"


def test_restarted_trainer_keeps_the_last_logged_values_until_it_logs() -> None:
    before = pg.to_progress(pg.parse_metrics(trainer_text()))
    m = TrainerMetrics(global_rank0=True)
    m.begin(100, 500)  # resumed from checkpoint-100, first logging step not reached yet
    p = pg.to_progress(pg.parse_metrics(m.text()), previous=before)
    assert p["step"] == 100 and p["display"] == "100/500"
    assert p["reward"] == before["reward"] and p["rewards"] == before["rewards"]


# ------------------------------------------------------------------------------------------ whom to scrape
def ep(pod: str, attempt: int = 0, running: bool = True, ip: str | None = "10.0.0.1", port: int | None = 9400):
    return pg.Endpoint(pod=pod, ip=ip, port=port, attempt=attempt, running=running)


def test_endpoints_to_scrape() -> None:
    eps = [ep("j-node-0"), ep("j-node-1"), ep("j-node-2", running=False), ep("j-node-3", ip=None),
           ep("j-node-4", port=None), ep("j-node-5", attempt=1)]
    assert [e.pod for e in pg.endpoints_to_scrape(eps, 0, None)] == ["j-node-0", "j-node-1"]
    assert [e.pod for e in pg.endpoints_to_scrape(eps, 0, "j-node-1")] == ["j-node-1"]  # one request per round
    assert [e.pod for e in pg.endpoints_to_scrape(eps, 0, "j-node-9")] == ["j-node-0", "j-node-1"]
    assert [e.pod for e in pg.endpoints_to_scrape(eps, 1, "j-node-1")] == ["j-node-5"]  # a new attempt
    assert ep("x", ip="fd00::5").url == "http://[fd00::5]:9400/metrics"


# ------------------------------------------------------------------------------------------ rate limit
def test_rate_limit_decisions() -> None:
    old, new = {"step": 1, "display": "1/9"}, {"step": 2, "display": "2/9"}
    d = pg.decide_write
    assert d(old, new, writing_anyway=False, last_write=None, now=100, interval=15).include  # first after a start
    assert not d(old, dict(old), writing_anyway=False, last_write=None, now=100, interval=15).include  # unchanged
    assert not d(old, None, writing_anyway=True, last_write=None, now=100, interval=15).include  # nothing scraped
    held = d(old, new, writing_anyway=False, last_write=95, now=100, interval=15)
    assert not held.include and held.retry_after == pytest.approx(10)
    assert d(old, new, writing_anyway=False, last_write=85, now=100, interval=15).include
    assert d(old, new, writing_anyway=True, last_write=99, now=100, interval=15).include  # rides along for free


def test_rate_limit_over_a_fast_logging_run() -> None:
    """A trainer logging every 0.1 s, scraped every 0.1 s, for 60 s: progress-only writes ≤ 60/15 + 1."""
    writes, last, current = [], None, None
    for i in range(600):
        now = i * 0.1
        latest = {"step": i, "display": f"{i}/600"}
        dec = pg.decide_write(current, latest, writing_anyway=False, last_write=last, now=now, interval=15)
        if dec.include:
            writes.append(now)
            last, current = now, latest
    assert len(writes) <= 60 / 15 + 1 and all(b - a >= 15 for a, b in zip(writes, writes[1:], strict=False)), writes


def test_merge_patch_removes_what_disappeared() -> None:
    old = {"phase": "Running", "progress": {"step": 1, "kl": 0.1, "rewards": {"a": 1.0, "b": 2.0}}}
    new_progress = {"step": 2, "rewards": {"a": 1.5}}
    patch = pg.fix_progress_patch({"progress": new_progress}, old)
    assert patch == {"progress": {"step": 2, "kl": None, "rewards": {"a": 1.5, "b": None}}}
    assert pg.fix_progress_patch(None, old) is None
    assert pg.fix_progress_patch({"progress": new_progress}, {}) == {"progress": new_progress}


# ------------------------------------------------------------------------------------------ operator metrics
def test_operator_metrics_text_parses() -> None:
    jobs = [{"metadata": {"namespace": "a"}, "status": {"phase": "Running"}},
            {"metadata": {"namespace": "a"}, "status": {"phase": "Running"}},
            {"metadata": {"namespace": "b"}}]
    opmetrics.track_jobs(lambda: jobs)
    opmetrics.api_error("PATCH", 409)
    opmetrics.RECONCILE_DURATION.observe(0.003)
    fams = families(opmetrics.text().decode())
    got = {(s.labels["namespace"], s.labels["phase"]): s.value for s in fams["grpo_operator_jobs"].samples}
    assert got == {("a", "Running"): 2, ("b", "Unknown"): 1}
    errs = {(s.labels["verb"], s.labels["code"]): s.value for s in fams["grpo_operator_api_errors"].samples
            if s.name.endswith("_total")}
    assert errs[("patch", "409")] >= 1
    assert any(s.name == "grpo_operator_reconcile_duration_seconds_count" and s.value >= 1
               for s in fams["grpo_operator_reconcile_duration_seconds"].samples)
    for name in ("grpo_operator_restarts", "grpo_operator_webhook_requests", "grpo_operator_webhook_denials",
                 "grpo_operator_progress_scrapes", "grpo_operator_status_writes", "process_resident_memory_bytes"):
        assert name in fams, name


def test_denial_reason_labels_are_bounded() -> None:
    r = review("CREATE", manifest("x", gpus=3, per_device=1, num_generations=8))
    assert not r.allowed and r.reason == "spec.training.numGenerations"
    assert reason_label("spec.training.fooBar") == "spec.training.(unknown)"
    assert reason_label("spec.rewards[3].name") == "spec.rewards.name"
    assert reason_label("spec.whatever") == "spec.(unknown)"
    old = manifest("x", nodes=1)
    r = review("UPDATE", manifest("x", nodes=2), old)
    assert not r.allowed and r.reason == "spec.nodes"


# ------------------------------------------------------------------------------------------ trainer callback
def test_progress_callback_feeds_lines_and_gauges() -> None:
    from grpo_trainer.progress import PREFIX, ProgressCallback

    m = TrainerMetrics(global_rank0=True)
    out = io.StringIO()
    cb = ProgressCallback(out, metrics=m)
    state = SimpleNamespace(global_step=10, max_steps=20, num_input_tokens_seen=1000, is_world_process_zero=True)
    cb.on_train_begin(None, state, None)
    assert pg.to_progress(pg.parse_metrics(m.text()))["display"] == "10/20"  # the resumed step, before any log
    cb.window[0] = (cb.window[0][0] - 2.0, 10, 1000.0)  # two seconds ago
    state.global_step = 12
    cb.on_log(None, state, None, logs={"reward": 0.5, "reward_std": 0.1, "num_tokens": 3000, "kl": float("nan"),
                                      "rewards/accuracy/mean": 0.5, "rewards/accuracy/std": 0.5,
                                      "rewards/length/mean": 0.25, "completions/mean_length": 7.5})
    rec = json.loads(out.getvalue().splitlines()[-1][len(PREFIX):])
    assert rec["step"] == 12 and rec["rewards"] == {"accuracy": 0.5, "length": 0.25} and rec["kl"] is None
    assert rec["tokensPerSecond"] == pytest.approx(1000, rel=0.05)  # 2000 tokens in ~2 s
    assert rec["etaSeconds"] == pytest.approx(8, rel=0.05)  # 2 steps in ~2 s, 8 left
    p = pg.to_progress(pg.parse_metrics(m.text()))
    assert p["display"] == "12/20" and p["rewards"] == {"accuracy": 0.5, "length": 0.25} and "kl" not in p
    cb.on_log(None, state, None, logs={"train_runtime": 3.0})  # the final summary is not a step
    assert len(out.getvalue().splitlines()) == 1


def test_local_progress_bar_shows_throughput_and_eta() -> None:
    line = progress_line({"step": 120, "maxSteps": 500, "reward": 0.61, "rewardStd": 0.2, "kl": None,
                          "completionLength": 180.0, "tokensPerSecond": 23456.0, "etaSeconds": 3725, "elapsed": 600})
    assert "step 120/500" in line and "23.5k tok/s" in line and "eta 1:02:05" in line


# ------------------------------------------------------------------------------------------ manifests
def test_manifests_expose_the_metrics_port() -> None:
    res = validation.validate(manifest("m", nodes=2))
    objs = manifests.core_objects(res.job, res.topology, "ns", uid="u")
    cfg = json.loads(objs[0]["data"]["config.json"])
    assert cfg["progress"] == {"enabled": True, "metricsPort": 9400}
    pods = [o for o in objs if o["kind"] == "Pod"]
    for p in pods:
        c = p["spec"]["containers"][0]
        assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in c["ports"]
        assert p["metadata"]["annotations"]["prometheus.io/port"] == "9400"
        assert p["metadata"]["labels"]["app.kubernetes.io/name"] == "grpo-trainer"  # what the PodMonitor selects
        assert p["spec"]["automountServiceAccountToken"] is False  # the trainer needs no credentials
    off = manifests.core_objects(res.job, res.topology, "ns", uid="u", metrics_port=0)
    assert json.loads(off[0]["data"]["config.json"])["progress"]["metricsPort"] == 0
    assert all(len(o["spec"]["containers"][0]["ports"]) == 1 for o in off if o["kind"] == "Pod")


def test_operator_flags() -> None:
    from grpo_operator.cli.grpo_operator import parse_args

    cfg = parse_args(["-A", "--metrics-listen", "0.0.0.0:8081", "--progress-interval", "2",
                      "--trainer-metrics-port", "9500"])
    assert (cfg.metrics_listen, cfg.progress_interval, cfg.trainer_metrics_port) == ("0.0.0.0:8081", 2.0, 9500)
    from grpo_operator.controller.settings import Settings

    env = Settings.from_env({"GRPO_PROGRESS_INTERVAL_SECONDS": "30", "GRPO_METRICS_LISTEN": ":9090",
                           "GRPO_TRAINER_METRICS_PORT": "0"})
    assert (env.progress_interval, env.metrics_listen, env.trainer_metrics_port) == (30.0, ":9090", 0)
    assert opmetrics.parse_listen(":9090") == ("0.0.0.0", 9090) and opmetrics.parse_listen("[::]:1") == ("::", 1)
    with pytest.raises(SystemExit):
        parse_args(["-A", "--metrics-listen", "nope"])
    for bad in ("0.0.0.0:0", ":65536", "host:", "8080"):
        with pytest.raises(ValueError, match="ADDR:PORT"):
            opmetrics.parse_listen(bad)


def test_final_progress_from_the_termination_message():
    from grpo_operator.lifecycle import progress as P

    prev = {"step": 117, "maxSteps": 120, "display": "117/120", "reward": 0.2, "etaSeconds": 12, "kl": 0.01}
    msg = 'GRPO_RESULT {"step":120,"maxSteps":120,"reward":0.28125,"rewardStd":0.1,"rewards":{"accuracy":0.5}}\n'
    out = P.from_result_message(msg, prev, now=0)
    assert out["step"] == 120 and out["display"] == "120/120" and out["etaSeconds"] == 0
    assert out["reward"] == 0.28125 and out["rewards"] == {"accuracy": 0.5} and out["kl"] == 0.01  # kept
    assert out["updateTime"] == "1970-01-01T00:00:00Z"
    for bad in (None, "", "grpo_trainer: config error (exit 10): …", "GRPO_RESULT {not json", 'GRPO_RESULT {"step":"x"}'):
        assert P.from_result_message(bad, prev) is None
