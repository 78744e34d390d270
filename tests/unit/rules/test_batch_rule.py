"""The batch rule's arithmetic, valid values and fixes (pure, property-tested)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_operator.rules import batch
from grpo_operator.rules.batch import BatchInput


def test_trl_message_for_the_classic_mistake():
    res = batch.check(BatchInput(nodes=1, nproc=1, per_device=4, grad_accum=1, num_generations=8, vllm_mode="none"))
    (issue,) = res.issues
    assert issue.code == "E4" and issue.field == "spec.training.numGenerations"
    assert issue.message == "generation_batch_size (4) must be divisible by num_generations (8)."
    assert issue.valid_values == (2, 4)
    text = issue.full_message()
    assert "this batch: 2, 4." in text and "numGenerations 8 → 4" in text and "perDeviceTrainBatchSize 4 → 8" in text


def test_breakdown():
    res = batch.check(BatchInput(nodes=2, nproc=4, per_device=4, grad_accum=2, num_generations=8))
    assert res.ok
    assert res.breakdown.as_dict() == {"worldSize": 8, "nprocPerNode": 4, "generationBatchSize": 64,
                                       "stepsPerGeneration": 2, "promptsPerGeneration": 8,
                                       "validNumGenerations": [2, 4, 8, 16, 32, 64]}


def test_explicit_generation_batch():
    res = batch.check(BatchInput(1, 4, 2, 1, 8, generation_batch_size=24))
    assert res.ok and res.breakdown.steps_per_generation == 3
    res = batch.check(BatchInput(1, 4, 2, 1, 8, generation_batch_size=20))
    assert [i.code for i in res.issues] == ["E1", "E4"]  # every error at once: 20 is no multiple of 8 either
    assert "generation_batch_size (20) must be divisible by the global batch size (8)." in res.issues[0].message
    res = batch.check(BatchInput(1, 4, 2, 1, 8, generation_batch_size=16, steps_per_generation=2))
    assert res.issues[0].code == "E2"


def test_eval_rule_uses_num_generations_eval():
    inp = BatchInput(1, 2, 4, 1, 8, eval_on=True, per_device_eval=3)
    assert [i.code for i in batch.check(inp).issues] == ["E3"]
    assert batch.check(replace(inp, num_generations_eval=2)).ok
    assert batch.check(replace(inp, eval_on=False)).ok


def test_colocate_tensor_parallel():
    inp = BatchInput(1, 3, 4, 1, 4, vllm_mode="colocate", tensor_parallel=2)
    assert [i.code for i in batch.check(inp).issues] == ["E6"]
    assert "tensor_parallel_size (2) must divide world size (3) evenly." in batch.check(inp).issues[0].message
    # W = 6 is divisible by 3 but a TP group of 3 would span the 2-GPU nodes: stricter than TRL.
    inp = BatchInput(3, 2, 4, 1, 8, vllm_mode="colocate", tensor_parallel=3)
    assert [i.code for i in batch.check(inp).issues] == ["X3"]
    assert batch.check(replace(inp, vllm_mode="server")).ok


def test_stricter_than_trl():
    assert batch.check(BatchInput(1, 1, 0, 1, 2)).issues[0].code == "X1"
    assert batch.check(BatchInput(1, 1, 4, 1, 2, steps_per_generation=-1)).issues[0].code == "X1"
    assert [i.code for i in batch.check(BatchInput(1, 1, 4, 1, 0)).issues] == ["E5"]
    assert batch.check(BatchInput(1, 1, 4, 1, 2, auto_find_batch_size=True)).issues[0].code == "E0"


def test_divisors():
    assert batch.divisors_at_least_2(1) == ()
    assert batch.divisors_at_least_2(36) == (2, 3, 4, 6, 9, 12, 18, 36)
    assert batch.divisors_at_least_2(97) == (97,)


sizes = st.integers(min_value=1, max_value=16)
inputs = st.builds(
    BatchInput,
    nodes=st.integers(1, 8),
    nproc=st.sampled_from([1, 2, 3, 4, 6, 8]),
    per_device=sizes,
    grad_accum=st.integers(1, 8),
    num_generations=st.integers(2, 32),
    steps_per_generation=st.one_of(st.none(), st.integers(1, 8)),
    generation_batch_size=st.none(),
    eval_on=st.booleans(),
    per_device_eval=sizes,
    num_generations_eval=st.one_of(st.none(), st.integers(2, 16)),
    vllm_mode=st.sampled_from(["colocate", "server", "none"]),
    tensor_parallel=st.sampled_from([1, 1, 2, 4]),
    nproc_field=st.just("spec.resources.limits[nvidia.com/gpu]"),
)


def _apply(inp: BatchInput, fix: batch.Fix) -> BatchInput:
    return batch.apply_fix(inp, fix)


@settings(max_examples=400, deadline=None)
@given(inputs)
def test_every_proposed_fix_fixes_a_single_error(inp):
    res = batch.check(inp)
    if len(res.issues) != 1:
        return
    (issue,) = res.issues
    assert issue.fixes, issue
    for fix in issue.fixes:
        assert batch.check(_apply(inp, fix)).ok, (inp, fix)


@settings(max_examples=300, deadline=None)
@given(inputs)
def test_fixes_never_break_something_else(inp):
    res = batch.check(inp)
    before = {i.code for i in res.issues}
    for issue in res.issues:
        for fix in issue.fixes:
            after = {i.code for i in batch.check(_apply(inp, fix)).issues}
            assert issue.code not in after and after <= before, (inp, fix, before, after)


@settings(max_examples=300, deadline=None)
@given(inputs)
def test_valid_values_are_exactly_the_working_num_generations(inp):
    res = batch.check(inp)
    if res.breakdown is None:
        return
    depends_on_g = {"E4"} | ({"E3"} if inp.eval_on and not inp.num_generations_eval else set())
    for g in range(2, min(res.breakdown.generation_batch_size, 64) + 1):
        changed = batch.check(replace(inp, num_generations=g))
        e4_or_e3 = {i.code for i in changed.issues} & depends_on_g
        assert (g in res.breakdown.valid_num_generations) == (not e4_or_e3), g
