"""Every error at once, every fix valid (rules/batch.py): a spec with several batch errors gets all of them in one
answer, and every printed fix, applied alone, yields a spec that the rule and TRL's own GRPOConfig accept.

Finding (issue 26): a spec with two errors reported one, and its printed fix ("remove generationBatchSize") produced
the next error; of 130 printed fixes, 16 left the spec invalid."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_operator.rules import batch, validation
from grpo_operator.rules.batch import BatchInput
from tests.support.jobs import manifest
from tests.support.oracle import trl_verdict

inputs = st.builds(
    BatchInput,
    nodes=st.integers(1, 4),
    nproc=st.sampled_from([1, 2, 3, 4, 8]),
    per_device=st.integers(1, 12),
    grad_accum=st.integers(1, 6),
    num_generations=st.integers(1, 24),
    steps_per_generation=st.one_of(st.none(), st.integers(1, 6)),
    generation_batch_size=st.one_of(st.none(), st.integers(1, 128)),
    eval_on=st.booleans(),
    per_device_eval=st.integers(1, 12),
    num_generations_eval=st.one_of(st.none(), st.integers(2, 12)),
    auto_find_batch_size=st.booleans(),
    vllm_mode=st.sampled_from(["colocate", "server", "none"]),
    tensor_parallel=st.sampled_from([1, 2, 3, 4]),
    nproc_field=st.just("spec.resources.limits[nvidia.com/gpu]"),
)


def _trl_kwargs(inp: BatchInput) -> dict:
    kw = {"per_device_train_batch_size": inp.per_device, "gradient_accumulation_steps": inp.grad_accum,
          "num_generations": inp.num_generations, "auto_find_batch_size": inp.auto_find_batch_size}
    if inp.steps_per_generation is not None:
        kw["steps_per_generation"] = inp.steps_per_generation
    if inp.generation_batch_size is not None:
        kw["generation_batch_size"] = inp.generation_batch_size
    if inp.eval_on:
        kw.update(eval_strategy="steps", per_device_eval_batch_size=inp.per_device_eval)
        if inp.num_generations_eval is not None:
            kw["num_generations_eval"] = inp.num_generations_eval
    return kw


@settings(max_examples=300, deadline=None)
@given(inputs)
def test_every_printed_fix_applied_alone_is_valid(inp):
    res = batch.check(inp)
    for issue in res.issues:
        for fix in issue.fixes:
            assert batch.check(batch.apply_fix(inp, fix)).ok, (inp, issue.code, fix.text())


@settings(max_examples=40, deadline=None)
@given(inputs.filter(lambda inp: len(batch.check(inp).issues) >= 2))
def test_trl_accepts_every_printed_fix_of_a_spec_with_several_errors(inp):
    """The oracle: TRL's GRPOConfig (E0–E5; E6 is GRPOTrainer's, X* the operator's stricter rules) accepts each."""
    for issue in batch.check(inp).issues:
        for fix in issue.fixes:
            fixed = batch.apply_fix(inp, fix)
            ok, message = trl_verdict(fixed.world_size, _trl_kwargs(fixed))
            assert ok, (inp, fix.text(), message)


@settings(max_examples=250, deadline=None)
@given(inputs)
def test_a_spec_trl_refuses_gets_at_least_one_complete_fix(inp):
    res = batch.check(inp)
    if res.issues:
        assert any(issue.fixes for issue in res.issues), res.issues


def test_all_errors_at_once_and_the_fix_of_one_fixes_the_spec():
    """generationBatchSize with stepsPerGeneration (E2) and a numGenerations that does not divide it (E4)."""
    inp = BatchInput(1, 4, 2, 1, 12, generation_batch_size=16, steps_per_generation=2, auto_find_batch_size=True,
                     vllm_mode="none")
    res = batch.check(inp)
    assert [i.code for i in res.issues] == ["E0", "E2", "E4"]
    for issue in res.issues:
        assert issue.fixes
        for fix in issue.fixes:
            assert batch.check(batch.apply_fix(inp, fix)).ok, fix.text()
    e2 = res.issues[1]
    assert any(f.text().startswith("remove generationBatchSize and ") for f in e2.fixes), [f.text() for f in e2.fixes]


def test_bounds_name_the_number():
    res = batch.check(BatchInput(1, 1, 99999999999, 1, 8))
    assert [i.code for i in res.issues] == ["X4"] and "at most 4096" in res.issues[0].message


def test_the_validator_prints_every_error_with_complete_fixes():
    doc = manifest("j", gpus=4)
    doc["spec"]["training"] = {"perDeviceTrainBatchSize": 2, "numGenerations": 12, "generationBatchSize": 16,
                               "stepsPerGeneration": 2}
    res = validation.validate(doc)
    fields = [e.field for e in res.errors]
    assert fields == ["spec.training.generationBatchSize", "spec.training.numGenerations"], res.summary()
    assert "remove generationBatchSize and numGenerations 12 → " in res.summary() or \
           "remove stepsPerGeneration and " in res.summary(), res.summary()
