"""grpo_trainer.vllm_support's start-up check, on stand-ins for vLLM's engine (the real one: tests/e2e/vllm)."""

from __future__ import annotations

import types

import pytest
import torch

from grpo_trainer.vllm_support import check_plain_linears


def engine(*linears: torch.nn.Module):
    """An object shaped like vLLM's LLM where TRL reaches the in-process model."""
    model = torch.nn.Sequential(*linears)
    runner = types.SimpleNamespace(model=model)
    executor = types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner))
    return types.SimpleNamespace(llm_engine=types.SimpleNamespace(model_executor=executor))


def linear(cpu_linear, weight=None) -> torch.nn.Module:
    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(torch.ones(4, 4) if weight is None else weight, requires_grad=False)
    m.cpu_linear = cpu_linear
    return m


def test_plain_linears_pass():
    check_plain_linears(engine(linear(torch.nn.functional.linear), linear(torch.nn.functional.linear)))


@pytest.mark.parametrize("bad", [linear(lambda x, w, b: x), linear(torch.nn.functional.linear, torch.empty(0, 4))],
                         ids=["repacked kernel", "weight removed"])
def test_a_linear_that_sync_cannot_reach_fails_at_start(bad):
    with pytest.raises(RuntimeError, match=r"1 linear layer\(s\) \(e.g. 1\) from a repacked copy"):
        check_plain_linears(engine(linear(torch.nn.functional.linear), bad))


def test_an_engine_of_another_shape_is_not_checked():
    check_plain_linears(types.SimpleNamespace(llm_engine=None))


def test_pin_revision_reaches_trls_colocate_llm(monkeypatch):
    """TRL 1.16 builds LLM(model=<id>) without the revision: the wrapper adds it for model and tokenizer."""
    from trl.generation import vllm_generation

    from grpo_trainer.vllm_support import pin_revision

    seen = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda *a, **kw: seen.append(kw))
    pin_revision("abc123")
    vllm_generation.LLM(model="org/model", trust_remote_code=True)
    assert seen == [{"model": "org/model", "trust_remote_code": True, "revision": "abc123",
                     "tokenizer_revision": "abc123"}]
