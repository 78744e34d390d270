"""`grpojob check`'s batch verdict equals TRL 1.16's own GRPOConfig on a grid of ≥ 5,000 configurations."""

from __future__ import annotations

import itertools
import multiprocessing
import random

import pytest

from grpo_operator.rules import validation
from tests.support.oracle import trl_verdicts

SPLITS = [(1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (1, 4), (2, 2), (4, 1), (1, 6), (2, 3), (3, 2), (6, 1),
          (1, 8), (2, 4), (4, 2), (8, 1), (2, 8), (4, 4), (16, 1)]
P = [1, 2, 3, 4, 8, 0, -1]
A = [1, 2, 3, 4]
G = [0, 1, 2, 3, 4, 6, 8, 16]
SB = [(None, None), (1, None), (2, None), (3, None), (4, None), (None, 8), (None, 12), (None, 16), (None, 24),
      (None, 48), (None, 64), (2, 16), (-1, None), (0, None), (None, 0)]
EVAL = [None, ("steps", 2, None), ("steps", 3, None), ("steps", 4, 2), ("steps", 8, 4), ("epoch", 6, 3)]
ROWS = 9000


def _grid() -> list[dict]:
    rng = random.Random(20261129)
    product = list(itertools.product(SPLITS, P, A, G, SB, EVAL))
    return [dict(split=s, p=p, a=a, g=g, sb=sb, ev=ev) for s, p, a, g, sb, ev in rng.sample(product, ROWS)]


def _trl_kwargs(row: dict) -> dict:
    kw = {"per_device_train_batch_size": row["p"], "gradient_accumulation_steps": row["a"],
          "num_generations": row["g"]}
    s, b = row["sb"]
    if s is not None:
        kw["steps_per_generation"] = s
    if b is not None:
        kw["generation_batch_size"] = b
    if row["ev"]:
        strategy, pe, ge = row["ev"]
        kw["eval_strategy"] = strategy
        kw["per_device_eval_batch_size"] = pe
        if ge is not None:
            kw["num_generations_eval"] = ge
    return kw


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(x.title() for x in rest)


def _doc(row: dict) -> dict:
    nodes, nproc = row["split"]
    return {
        "apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "grid"},
        "spec": {
            "model": "m", "dataset": {"name": "d", **({"evalSplit": "test"} if row["ev"] else {})},
            "rewards": [{"name": "accuracy"}],
            "nodes": nodes, "resources": {"limits": {"nvidia.com/gpu": nproc}},
            "vllm": {"mode": "none"},  # E6 (a GRPOTrainer check, not GRPOConfig's) is tested separately
            "training": {_camel(k): v for k, v in _trl_kwargs(row).items()},
        },
    }


def _sane(row: dict) -> bool:
    """Rows TRL treats sanely: every size positive (TRL multiplies negative sizes into nonsense)."""
    s, b = row["sb"]
    return row["p"] >= 1 and (s is None or s >= 1) and (b is None or b >= 1)


@pytest.fixture(scope="module")
def verdicts():
    grid = _grid()
    rows = [(r["split"][0] * r["split"][1], _trl_kwargs(r)) for r in grid]
    chunks = [rows[i::2] for i in range(2)]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        parts = pool.map(trl_verdicts, chunks)
    trl = [None] * len(rows)
    for i, part in enumerate(parts):
        trl[i::2] = part
    return grid, trl


def test_grid_is_large_and_varied(verdicts):
    grid, trl = verdicts
    assert len(grid) >= 5000
    assert {r["split"][0] * r["split"][1] for r in grid} >= {1, 2, 3, 4, 6, 8, 16}
    accepted = sum(ok for ok, _ in trl)
    assert 0.15 * len(grid) < accepted < 0.85 * len(grid), accepted  # both verdicts well represented


def test_verdict_equals_trl_on_sane_rows_and_is_stricter_on_edge_rows(verdicts):
    grid, trl = verdicts
    disagreements, edge, sane = [], 0, 0
    for row, (trl_ok, trl_msg) in zip(grid, trl, strict=False):
        res = validation.validate(_doc(row))
        ours = res.valid
        if _sane(row):
            sane += 1
            if ours != trl_ok:
                disagreements.append((row, trl_msg, res.summary()))
            elif not trl_ok and not trl_msg.startswith("ZeroDivisionError"):
                # TRL's own words and numbers appear in our message for the error TRL raised first.
                assert any(trl_msg in e.message for e in res.errors), (row, trl_msg, res.summary())
        else:
            edge += 1
            assert not ours, (row, "TRL accepts this nonsense; the operator must not")
    assert not disagreements, disagreements[:5]
    assert sane >= 5000 and edge >= 300
    print(f"oracle grid: {len(grid)} rows, {sane} sane rows agree with TRL, {edge} edge rows rejected")
