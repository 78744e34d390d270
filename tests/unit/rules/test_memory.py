"""`grpojob check`'s memory explanation (rules/memory.py): the parameter count from the id, the load dtype as TRL
chooses it, what LoRA, the reference model and sharding change."""

from __future__ import annotations

import pytest

from grpo_operator.rules import memory, validation
from tests.support.jobs import job_body


@pytest.mark.parametrize("model, params", [
    ("Qwen/Qwen2.5-7B-Instruct", 7e9),
    ("Qwen/Qwen2.5-0.5B-Instruct", 0.5e9),
    ("meta-llama/Llama-3.1-70B", 70e9),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", 135e6),
    ("/models/qwen-1.5b/", 1.5e9),
    ("org/model_3b", 3e9),
    ("gpt2", None),
    ("Qwen/Qwen2.5-Math", None),
    ("org/b7-model", None),          # not a size token
    ("org/Mixtral-8x7B", None),      # a mixture: the id does not give the total count
    ("org/model-7Bit", None),
])
def test_parameters_from_id(model, params):
    assert memory.parameters_from_id(model) == params


@pytest.mark.parametrize("kwargs, nbytes, how", [
    (None, 4, "float32 (TRL's default"),
    ({}, 4, "float32 (TRL's default"),
    ({"dtype": "bfloat16"}, 2, "bfloat16"),
    ({"torch_dtype": "float16"}, 2, "float16"),
    ({"dtype": "torch.float32"}, 4, "float32"),
    ({"dtype": "auto"}, None, "config's dtype"),
    ({"dtype": "int8"}, None, "int8"),
])
def test_load_dtype(kwargs, nbytes, how):
    got, text = memory.load_dtype(kwargs)
    assert got == nbytes and how in text


def _estimate(**spec):
    body = job_body("m", **{k: v for k, v in spec.items() if k in ("nodes", "gpus")})
    body["spec"]["model"] = spec.get("model", "Qwen/Qwen2.5-7B-Instruct")
    body["spec"]["training"].update(spec.get("training", {}))
    if "peft" in spec:
        body["spec"]["peft"] = spec["peft"]
    res = validation.validate(body)
    assert res.valid, res.summary()
    assert res.job is not None and res.topology is not None
    return res, memory.estimate(res.job, res.topology.world_size)


def test_full_fine_tuning_in_float32_is_four_copies_and_lora_names_the_saving():
    res, est = _estimate(training={})
    assert est.copies() == [("weights", 1.0), ("gradients", 1.0), ("AdamW states", 2.0)]
    gib = 7e9 * 4 / memory.GIB
    assert est.total_gib() == pytest.approx(4 * gib)
    assert est.total_gib(lora=True) == pytest.approx(gib)
    assert res.job is not None
    lines = memory.explain(res.job, 4)
    assert "7B parameters" in lines[0] and "float32" in lines[0] and f"≈ {4 * gib:.1f} GiB" in lines[0]
    assert f"with LoRA (spec.peft) ≈ {gib:.1f} GiB" in lines[1]
    assert "vLLM colocate reserves 30%" in lines[2]


def test_beta_adds_a_reference_copy_without_lora_only():
    _, full = _estimate(training={"beta": 0.04, "modelInitKwargs": {"dtype": "bfloat16"}})
    assert ("reference model", 1.0) in full.copies()
    assert full.total_gib() == pytest.approx(5 * 7e9 * 2 / memory.GIB)
    _, lora = _estimate(training={"beta": 0.04}, peft={"r": 16, "alpha": 32})
    assert lora.copies() == [("weights", 1.0)] and not lora.reference_copy


def test_lora_lines_give_the_full_fine_tuning_figure():
    res, est = _estimate(peft={"r": 8, "alpha": 16}, training={"modelInitKwargs": {"dtype": "bfloat16"}})
    assert res.job is not None
    lines = memory.explain(res.job, 4)
    assert lines[1].startswith("LoRA: gradients and AdamW states for the adapter only")
    assert f"full fine-tuning would need ≈ {4 * 7e9 * 2 / memory.GIB:.1f} GiB" in lines[1]


def test_sharding_divides_by_the_world_size():
    est = memory.MemoryEstimate(parameters=70e9, bytes_per_weight=2, dtype="bfloat16", lora=False,
                                reference_copy=False, sharded=True, world_size=16)
    assert est.total_gib() == pytest.approx(4 * 70e9 * 2 / memory.GIB / 16)
    assert "÷16 sharded" in est.lines("none", 0.3)[0]


def test_unknown_size_or_dtype_explains_in_copies_of_the_weights():
    est = memory.MemoryEstimate(parameters=None, bytes_per_weight=4, dtype="float32", lora=False,
                                reference_copy=True, sharded=False, world_size=1)
    head = est.lines("server", 0.9)[0]
    assert "not in the model id" in head and "gradients ×1 + AdamW states ×2 + reference model ×1" in head
    assert est.total_gib() is None and len(est.lines("server", 0.9)) == 1  # no LoRA figure, no colocate line
    auto = memory.MemoryEstimate(parameters=7e9, bytes_per_weight=None, dtype="auto", lora=True,
                                 reference_copy=False, sharded=False, world_size=1)
    assert auto.total_gib() is None and "weights ×1" in auto.lines("none", 0.3)[0]


def test_spec_parallelism_shards_over_the_world_size():
    """Finding (issue 26): the estimate read only training.deepspeed/fsdp, so examples/zero3-2x8.yaml printed ≈ 238 GiB
    per GPU for a 32B model sharded over 16 GPUs."""
    import pathlib

    import yaml

    doc = yaml.safe_load(pathlib.Path("examples/zero3-2x8.yaml").read_text())
    res = validation.validate(doc)
    assert res.valid and res.job is not None and res.topology is not None
    est = memory.estimate(res.job, res.topology.world_size)
    full = 4 * 32e9 * 2 / memory.GIB  # weights + gradients + two AdamW moments, bfloat16
    assert est.sharded and est.total_gib() == pytest.approx(full / 16)
    assert "÷16 sharded" in memory.explain(res.job, 16)[0]


@pytest.mark.parametrize("strategy, offload, left", [
    ("zero3", "optimizer", 2.0),   # weights + gradients stay, AdamW states on the CPU
    ("zero3", "parameters", 1.0),  # gradients only
    ("fsdp", "none", 4.0),
    ("fsdp", "parameters", 0.0),   # FSDP's CPUOffload moves parameters, gradients and states
    ("ddp", "none", 4.0),
])
def test_offload_leaves_the_gpu_figure(strategy, offload, left):
    res, _ = _estimate(training={"modelInitKwargs": {"dtype": "bfloat16"}}, nodes=2, gpus=4)
    assert res.job is not None
    res.job.spec.parallelism = memory.ParallelismSpec(strategy=strategy, offload=offload)
    est = memory.estimate(res.job, 8)
    unit = 7e9 * 2 / memory.GIB
    assert est.total_gib() == pytest.approx(left * unit / (1 if strategy == "ddp" else 8))
    if offload != "none":
        assert "offloaded to CPU memory" in memory.explain(res.job, 8)[0]
