"""`kubectl grpo plot`'s pure parts: progress/history lines → samples (client/history.py) → a terminal chart
(client/plot.py), and the verb itself over a fake client (flags, -o json, notes on stderr, exit codes)."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest

from grpo_operator.cli import kubectl_grpo as cli
from grpo_operator.cli import kubectl_plot
from grpo_operator.client import history as h
from grpo_operator.client import plot
from grpo_operator.client.history import Sample, Series


def progress(step: int, **kw: Any) -> str:
    return "GRPO_PROGRESS " + json.dumps({"step": step, **kw})


def replayed(step: int, **kw: Any) -> str:
    return "GRPO_HISTORY " + json.dumps({"step": step, **kw})


# ------------------------------------------------------------------------------------------------ parsing
def test_a_progress_line_becomes_a_sample_of_the_pods_attempt() -> None:
    s = h.parse_line(progress(7, reward=0.5, rewards={"accuracy": 0.25, "format": None}, kl=0.01,
                              completionLength=12.5, attempt=9), attempt=2)
    assert s == Sample(attempt=2, step=7, reward=0.5, rewards={"accuracy": 0.25, "format": None}, kl=0.01,
                       completion_length=12.5)


def test_a_history_line_keeps_the_attempt_that_logged_it() -> None:
    assert h.parse_line(replayed(3, attempt=1, reward=0.1), attempt=4) == Sample(1, 3, reward=0.1, replayed=True)
    assert h.parse_line(replayed(3, reward=0.1), attempt=4).attempt == 0  # untagged: an older trainer's checkpoint


@pytest.mark.parametrize("text", [
    "", "step 3 reward 0.5", "GRPO_PROGRESS", "GRPO_PROGRESS {", "GRPO_PROGRESS []", "GRPO_PROGRESS {\"reward\": 1}",
    "GRPO_PROGRESS {\"step\": -1}", "GRPO_PROGRESS {\"step\": true}", "GRPO_PROGRESS {\"step\": 1.5}",
    "GRPO_RESULT {\"step\": 3}", "xGRPO_PROGRESS {\"step\": 3}",
])
def test_other_and_broken_lines_are_skipped(text: str) -> None:
    assert h.parse_line(text, 0) is None


def test_non_finite_and_non_numeric_values_become_none() -> None:
    s = h.parse_line('GRPO_PROGRESS {"step": 1, "reward": NaN, "kl": Infinity, "completionLength": "12", '
                     '"rewards": {"a": true, "b": -Infinity}}', 0)
    assert s is not None and (s.reward, s.kl, s.completion_length, s.rewards) == (None, None, None,
                                                                                  {"a": None, "b": None})


def test_merge_prefers_live_lines_and_orders_by_attempt_then_step() -> None:
    got = h.merge([Sample(1, 5, reward=1.0), Sample(0, 4, reward=0.3, replayed=True), Sample(0, 4, reward=0.4),
                   Sample(0, 2, reward=0.2, replayed=True), Sample(1, 5, reward=9.0, replayed=True)])
    assert [(s.attempt, s.step, s.reward, s.replayed) for s in got] == [(0, 2, 0.2, True), (0, 4, 0.4, False),
                                                                       (1, 5, 1.0, False)]


def test_series_of_each_metric() -> None:
    samples = [Sample(0, 1, reward=0.5, rewards={"accuracy": 0.0}, kl=None, completion_length=10),
               Sample(1, 2, reward=None, rewards={"accuracy": 1.0, "format": 0.5}, kl=0.2)]
    rw = h.series(samples, "reward")
    assert [(s.name, s.points) for s in rw] == [("reward", ((0, 1, 0.5),)),
                                                ("reward/accuracy", ((0, 1, 0.0), (1, 2, 1.0))),
                                                ("reward/format", ((1, 2, 0.5),))]
    assert h.series(samples, "kl") == [Series("kl", ((1, 2, 0.2),))]
    assert h.series(samples, "completion_length") == [Series("completion_length", ((0, 1, 10.0),))]
    with pytest.raises(ValueError, match="unknown metric 'loss'"):
        h.series(samples, "loss")


def test_restarts_are_the_first_step_of_every_later_attempt() -> None:
    samples = [Sample(0, 1), Sample(0, 9), Sample(2, 6), Sample(2, 8), Sample(3, 8)]
    assert h.restarts(samples) == [(2, 6), (3, 8)]
    assert h.restarts([Sample(1, 4), Sample(2, 5)]) == [(2, 5)]  # --attempt 1 onwards: 1 is the first shown
    assert h.restarts([]) == []


def test_history_as_json() -> None:
    hist = h.History(job="j", namespace="ns", attempt=1, samples=[Sample(0, 1, reward=0.5, replayed=True),
                                                                   Sample(1, 2, reward=0.7, kl=0.1)],
                     sources={1: "j-node-0"}, notes=["attempt 0: …"])
    doc = hist.as_dict()
    assert doc["restarts"] == [{"attempt": 1, "step": 2}] and doc["sources"] == {"1": "j-node-0"}
    assert doc["series"]["reward"] == [{"attempt": 0, "step": 1, "value": 0.5}, {"attempt": 1, "step": 2, "value": 0.7}]
    assert doc["series"]["kl"] == [{"attempt": 1, "step": 2, "value": 0.1}]
    assert doc["series"]["completion_length"] == []
    assert list(hist.as_dict(["kl"])["series"]) == ["kl"]
    json.dumps(doc)


# ------------------------------------------------------------------------------------------------ the chart
def rising(n: int = 30, attempt: int = 0, start: int = 1) -> Series:
    return Series("reward", tuple((attempt, start + i, i / 10) for i in range(n)))  # 0 … (n-1)/10


def width_of(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_an_empty_chart_says_so() -> None:
    assert plot.chart("reward", []) == "reward: no data (no progress line has this metric yet)"
    assert "no data" in plot.chart("kl", [Series("kl", ())])
    assert "no data" in plot.chart("kl", [Series("kl", ((0, 1, math.nan), (0, 2, math.inf)))])


def test_one_point() -> None:
    text = plot.chart("kl", [Series("kl", ((0, 5, 0.25),))], width=40, height=5)
    lines = text.splitlines()
    assert lines[0] == "kl" and sum(line.count("●") for line in lines[1:-1]) == 1
    assert "step 5" in text and "● kl (0.25 at step 5)" in text
    assert width_of(text) <= 40


def test_a_flat_line_is_drawn_in_the_middle() -> None:
    text = plot.chart("r", [Series("r", tuple((0, i, 0.5) for i in range(10)))], width=40, height=5)
    rows = text.splitlines()[1:6]
    assert [r.count("●") for r in rows] == [0, 0, 10, 0, 0]
    assert rows[2].lstrip().startswith("0.5 ┤")


def test_axes_labels_and_monotone_shape() -> None:
    text = plot.chart("reward", [rising()], width=60, height=10)
    rows = text.splitlines()[1:11]
    assert rows[0].lstrip().startswith("2.9 ┤") and rows[-1].lstrip().startswith("0 ┤")
    cols = [r.index("●") for r in rows if "●" in r]  # rising: the highest row holds the rightmost points
    assert cols == sorted(cols, reverse=True)
    assert "step 1" in text and text.splitlines()[12].rstrip().endswith("30")


def test_nan_points_are_skipped_not_drawn() -> None:
    s = Series("kl", ((0, 1, 0.1), (0, 2, math.nan), (0, 3, 0.3)))
    text = plot.chart("kl", [s], width=30, height=4)
    assert sum(line.count("●") for line in text.splitlines()[1:5]) == 2 and "nan" not in text.lower()


def test_a_restart_is_marked_and_lines_do_not_join_across_it() -> None:
    a0 = [(0, s, 1.0) for s in (1, 10)]
    a1 = [(1, s, 0.0) for s in (11, 20)]
    text = plot.chart("reward", [Series("reward", tuple(a0 + a1))], restarts=[(1, 11)], width=44, height=6)
    lines = text.splitlines()
    assert "↻1" in lines[1]
    col = lines[1].index("↻")
    assert all(line[col] in "┆●" for line in lines[2:8]), text
    assert lines[8][col] == "┴"
    # attempt 0's dots stay on its own row; nothing is interpolated from 1.0 down to 0.0 across the restart
    assert all(line.count("·") == 0 for line in lines[3:7]), text


def test_several_series_have_their_own_markers_and_a_legend() -> None:
    lines = [Series("reward", ((0, 1, 1.0), (0, 2, 2.0))), Series("reward/accuracy", ((0, 1, 0.0),)),
             Series("reward/format", ())]
    text = plot.chart("reward", lines, width=100)
    assert "●" in text and "×" in text
    assert "● reward (2 at step 2)   × reward/accuracy (0 at step 1)   + reward/format (no data)" in text


@pytest.mark.parametrize("width", [1, 10, 24, 25, 33, 80, 200])
def test_any_width_fits(width: int) -> None:
    lines = [rising(100), Series("reward/a-long-reward-function-name", tuple((0, i, -i * 1e-5) for i in range(50)))]
    text = plot.chart("reward", lines, restarts=[(1, 60)], width=width, height=3)
    limit = max(width, plot.MIN_WIDTH)
    chart, legend = text.splitlines()[:-2], text.splitlines()[-2:]
    assert width_of("\n".join(chart)) <= limit, text
    # the legend wraps at the width; only an entry longer than the width by itself overflows, on its own line
    assert all(len(line) <= limit or "   " not in line for line in legend), text
    assert "● reward (9.9 at step 100)" in text and "× reward/a-long-reward-function-name" in text
    body = [line for line in text.splitlines() if "┤" in line]
    assert len(body) == plot.MIN_HEIGHT


def test_a_restart_at_the_right_edge_keeps_its_tag_inside() -> None:
    text = plot.chart("r", [rising(10)], restarts=[(12, 10)], width=30, height=4)
    assert text.splitlines()[1].rstrip().endswith("↻12") and width_of(text) <= 30


def test_ascii_mode_uses_only_ascii() -> None:
    text = plot.chart("r", [rising(), Series("b", ((1, 40, 1.0),))], restarts=[(1, 40)], width=50, ascii=True)
    text.encode("ascii")
    assert "^1" in text and "*" in text and "x" in text


@pytest.mark.parametrize("value,text", [(0, "0"), (0.5, "0.5"), (1234.5678, "1235"), (123456, "123456"),
                                        (1e-7, "1.00e-07"), (-2.5e9, "-2.50e+09"), (0.001234, "0.001234")])
def test_axis_numbers(value: float, text: str) -> None:
    assert plot.fmt(value) == text


# ------------------------------------------------------------------------------------------------ the verb
class PlotClient:
    def __init__(self, hist: h.History, **kw: Any):
        self.hist, self.kw, self.calls = hist, kw, []
        self.namespace = kw.get("namespace") or "default"

    def get_progress_history(self, name: str, attempt: Any = None) -> h.History:
        self.calls.append((name, attempt))
        return self.hist


def run_cli(argv: list[str], hist: h.History, capsys: Any) -> tuple[int, str, str, list[Any]]:
    made: list[PlotClient] = []

    def make(**kw: Any) -> PlotClient:
        made.append(PlotClient(hist, **kw))
        return made[-1]

    code = cli.main(argv, make_client=make)
    out, err = capsys.readouterr()
    return code, out, err, made[0].calls if made else []


HIST = h.History(job="train", namespace="ns", attempt=1,
                 samples=[Sample(0, 1, reward=0.1, rewards={"accuracy": 0.0}, kl=0.0, completion_length=20,
                                 replayed=True),
                          Sample(0, 2, reward=0.2, rewards={"accuracy": 0.5}, kl=0.01, completion_length=18,
                                 replayed=True),
                          Sample(1, 3, reward=0.3, rewards={"accuracy": 1.0}, kl=0.02, completion_length=15)],
                 sources={1: "train-node-0"},
                 notes=["attempt 0: steps up to the checkpoint the next attempt resumed from"])


def test_plot_draws_every_metric_and_says_what_it_could_not_read(capsys: Any) -> None:
    code, out, err, calls = run_cli(["plot", "train", "--width", "60"], HIST, capsys)
    assert code == 0 and calls == [("train", None)]
    assert [line for line in out.splitlines() if ": ns/train" in line] == [
        "reward: ns/train", "kl: ns/train", "completion_length: ns/train"]
    assert out.count("↻1") == 3 and "reward/accuracy" in out
    assert err == "kubectl-grpo: attempt 0: steps up to the checkpoint the next attempt resumed from\n"


def test_plot_one_metric_one_attempt_ascii(capsys: Any) -> None:
    code, out, err, calls = run_cli(["plot", "train", "--metric", "kl", "--attempt", "1", "--ascii", "--width", "40",
                                     "--height", "5"], HIST, capsys)
    assert code == 0 and calls == [("train", 1)]
    out.encode("ascii")
    assert out.startswith("kl: ns/train\n")
    assert "completion_length" not in out and len([line for line in out.splitlines() if "|" in line]) == 5


def test_plot_json(capsys: Any) -> None:
    code, out, _, _ = run_cli(["plot", "train", "-o", "json", "--metric", "reward"], HIST, capsys)
    doc = json.loads(out)
    assert code == 0 and set(doc["series"]) == {"reward", "reward/accuracy"}
    assert doc["restarts"] == [{"attempt": 1, "step": 3}]


def test_plot_without_data_exits_1_with_the_reason(capsys: Any) -> None:
    empty = h.History(job="train", namespace="ns", attempt=0, notes=["attempt 0: train-node-0 has not started"])
    code, out, err, _ = run_cli(["plot", "train"], empty, capsys)
    assert code == 1 and out == ""
    assert err.splitlines() == ["kubectl-grpo: attempt 0: train-node-0 has not started",
                                "kubectl-grpo: no progress lines in the logs of ns/train yet (the trainer prints one "
                                "per logging step, spec.training.loggingSteps)"]


@pytest.mark.parametrize("argv,message", [
    (["plot"], "the following arguments are required: name"),
    (["plot", "x", "--metric", "loss"], "invalid choice: 'loss'"),
    (["plot", "x", "--width", "0"], "'0' must be ≥ 1"),
    (["plot", "x", "--attempt", "-1"], "'-1' must be ≥ 0"),
    (["plot", "x", "-A"], "-A/--all-namespaces applies to list only, not plot"),
])
def test_plot_flag_errors(argv: list[str], message: str, capsys: Any) -> None:
    code, out, err, _ = run_cli(argv, HIST, capsys)
    assert code == 1 and out == "" and message in err and len(err.splitlines()) == 1


def test_unicode_is_used_only_where_the_terminal_can_show_it() -> None:
    assert kubectl_plot._unicode_ok(io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    assert not kubectl_plot._unicode_ok(io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert not kubectl_plot._unicode_ok(object())
