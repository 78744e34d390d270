"""Built-in rewards (accuracy, format, length), custom import, and building the reward list."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_trainer import rewards
from grpo_trainer.config import RewardSpec
from grpo_trainer.exitcodes import REWARD, TrainerError

pytestmark = pytest.mark.usefixtures("helpers_on_path")


@pytest.mark.parametrize("text, value", [
    ("Natalia sold 48/2 = 24 clips.\n#### 72", 72),
    ("so the answer is \\boxed{1,234}.", 1234),
    ("\\boxed{\\frac{1}{2}} hmm \\boxed{-3.5}", Fraction(-7, 2)),
    ("<answer> $18 </answer>", 18),
    ("first 3 then 4 finally 12", 12),
    ("#### 3/4", Fraction(3, 4)),
    ("no numbers here", None),
])
def test_extract_answer(text, value):
    assert rewards.extract_answer(text) == (None if value is None else Fraction(value))


def test_accuracy_gsm8k_and_boxed_and_chat_completions():
    completions = ["... #### 7", "\\boxed{7.0}", "it is 8", [{"role": "assistant", "content": "answer: 7"}], "#### 1,000"]
    answers = ["3 + 4 = 7 #### 7", "#### 7", "#### 7", "#### 7", "#### 1000"]
    assert rewards.accuracy(completions, answer=answers) == [1.0, 1.0, 0.0, 1.0, 1.0]


def test_accuracy_without_reference_is_none():
    assert rewards.accuracy(["7"], answer=["no number"]) == [None]
    assert rewards.accuracy(["7", "8"]) == [None, None]


@given(st.integers(-10**9, 10**9))
def test_accuracy_numeric_roundtrip(n):
    assert rewards.accuracy([f"The answer is {n:,}."], answer=[f"#### {n}"]) == [1.0]
    assert rewards.accuracy([f"#### {n + 1}"], answer=[f"#### {n}"]) == [0.0]


def test_format():
    assert rewards.format([
        "<think>3 plus 4</think>\n<answer>7</answer>",
        "<reasoning>r</reasoning><answer>7</answer>",
        "blah <answer>7</answer>",
        "<think>no answer</think>",
        [{"role": "assistant", "content": "<think>x</think><answer>1</answer>"}],
    ]) == [1.0, 1.0, 0.5, 0.0, 1.0]


def test_length_is_continuous_in_unit_interval():
    length = rewards.make_length(16)
    assert length.__name__ == "length"
    assert length(["a"] * 4, completion_ids=[[1] * 16, [1] * 8, [1] * 4, []]) == [0.0, 0.5, 0.75, 1.0]
    assert length(["one two", "one two three four"], completion_ids=None) == [1 - 2 / 16, 1 - 4 / 16]


def test_import_custom_function():
    f = rewards.import_function("my_rewards:digits")
    assert f(["a1", "bb"]) == [0.5, 0.0]
    assert rewards.import_function("my_rewards:Scorer.score")(["x"]) == [0.0]


@pytest.mark.parametrize("path, needle", [
    ("nosuch_module:f", "cannot import module 'nosuch_module'"),
    ("my_rewards:nosuch", "has no attribute 'nosuch'"),
    ("my_rewards:not_callable", "is not callable"),
    ("my_rewards", "not of the form module:function"),
    ("broken_rewards:f", "RuntimeError: boom at import"),
])
def test_import_errors_are_permanent_one_liners(path, needle):
    with pytest.raises(TrainerError) as e:
        rewards.import_function(path)
    assert e.value.code == REWARD and needle in e.value.message and "\n" not in e.value.line()


def test_build_order_and_errors():
    specs = [RewardSpec("accuracy", None), RewardSpec(None, "my_rewards:digits", 0.5), RewardSpec("length", None),
             RewardSpec("format", None)]
    funcs = rewards.build(specs, max_completion_length=8, answer_column="answer")
    assert [f.__name__ for f in funcs] == ["accuracy", "digits", "length", "format"]
    with pytest.raises(TrainerError, match="unknown built-in reward 'lenght'"):
        rewards.build([RewardSpec("lenght", None)], max_completion_length=8, answer_column=None)
    with pytest.raises(TrainerError, match="answerColumn"):
        rewards.build([RewardSpec("accuracy", None)], max_completion_length=8, answer_column=None)


def test_a_missing_reward_model_is_a_reward_error(tmp_path):
    with pytest.raises(TrainerError) as err:
        rewards.build([RewardSpec(name=None, function=None, model=str(tmp_path / "no-rm"))], max_completion_length=8,
                answer_column=None)
    assert err.value.code == REWARD and "no-rm" in err.value.message
