"""Reward functions: the built-ins (accuracy, format, length), custom `module:function` imports, and weights.

Every reward follows TRL's calling convention: `f(prompts, completions, completion_ids, **columns) -> list[float|None]`.
Completions are strings, or lists of chat messages for conversational datasets.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from .exitcodes import REWARD, TrainerError


def completion_text(completion: Any) -> str:
    """The text of a completion: a string as is, a message list as the content of its messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        return "\n".join(completion_text(m) for m in completion)
    return str(completion)


_NUMBER = r"-?\$?\s*\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?"
_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_NUMBER_RE = re.compile(_NUMBER)


def parse_number(text: str) -> Fraction | None:
    """The first number in `text` (commas, $ and simple fractions allowed), exactly as a Fraction."""
    m = _NUMBER_RE.search(text)
    if not m:
        return None
    s = m.group(0).replace(",", "").replace("$", "").replace(" ", "")
    try:
        if "/" in s:
            num, den = s.split("/")
            return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def extract_answer(text: str) -> Fraction | None:
    """The final numeric answer: the last \\boxed{..}, else the last `#### n`, else <answer>, else the last number."""
    for pattern in (_BOXED, _HASHES, _ANSWER_TAG):
        found = pattern.findall(text)
        if found:
            value = parse_number(found[-1])
            if value is not None:
                return value
    numbers = _NUMBER_RE.findall(text)
    return parse_number(numbers[-1]) if numbers else None


def accuracy(completions, answer=None, **kwargs) -> list[float | None]:
    """1.0 when the completion's final number equals the reference answer's (GSM8K `#### n` or \\boxed{n}), else 0.0."""
    if answer is None:
        return [None] * len(completions)
    out: list[float | None] = []
    for completion, ref in zip(completions, answer, strict=False):
        gold = extract_answer(str(ref)) if ref is not None else None
        if gold is None:
            out.append(None)  # no usable reference: TRL ignores this sample for this reward
            continue
        pred = extract_answer(completion_text(completion))
        out.append(1.0 if pred is not None and pred == gold else 0.0)
    return out


_FULL_FORMAT = re.compile(r"^\s*<(think|reasoning)>.*?</\1>\s*<answer>.*?</answer>\s*$", re.S)


def format(completions, **kwargs) -> list[float]:
    """1.0 for `<think>…</think><answer>…</answer>` (or <reasoning>), 0.5 for an <answer> tag alone, else 0.0."""
    out = []
    for completion in completions:
        text = completion_text(completion)
        out.append(1.0 if _FULL_FORMAT.match(text) else 0.5 if _ANSWER_TAG.search(text) else 0.0)
    return out


def make_length(max_completion_length: int) -> Callable[..., list[float]]:
    """`length`: 1 - tokens/max_completion_length, a continuous reward in [0, 1] that favours concise answers."""
    limit = max(1, int(max_completion_length))

    def length(completions, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is None:
            sizes = [len(completion_text(c).split()) for c in completions]
        else:
            sizes = [len(ids) for ids in completion_ids]
        return [max(0.0, 1.0 - n / limit) for n in sizes]

    return length


BUILTINS = ("accuracy", "format", "length")


def import_function(path: str) -> Callable:
    """Import `module:function` (the function may be dotted, e.g. `pkg.mod:Scorer.score`)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TrainerError(REWARD, f"reward function {path!r} is not of the form module:function "
                                   "(e.g. my_rewards:score)")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise TrainerError(REWARD, f"reward function {path!r}: cannot import module {module_name!r} ({e}); "
                                   "mount the file and put its directory on PYTHONPATH") from None
    except Exception as e:
        raise TrainerError(REWARD, f"reward function {path!r}: importing {module_name!r} failed: "
                                   f"{type(e).__name__}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TrainerError(REWARD, f"reward function {path!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TrainerError(REWARD, f"reward function {path!r} is not callable ({type(obj).__name__})")
    return obj


# model_init_kwargs that also shape a reward model (TRL applies all of the policy's; the revision is not applied:
# it names a commit of the policy's repository, not of the reward model's).
_REWARD_INIT_KEYS = ("dtype", "attn_implementation", "trust_remote_code")


def load_reward_model(path: str, init_kwargs: dict[str, Any] | None = None, revision: str | None = None):
    """A reward model as TRL loads a string in reward_funcs: AutoModelForSequenceClassification, one label; TRL
    names its metric after the last part of the id (rewards/<basename>/mean) and loads its tokenizer. `revision`:
    the commit staged for it (spec.cache, pins.py); its tokenizer is then loaded here at that commit too
    (processing_classes), since TRL would load it at `main`."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from . import data

    kw = {k: v for k, v in (init_kwargs or {}).items() if k in _REWARD_INIT_KEYS}
    trust = bool(kw.get("trust_remote_code", False))
    try:  # the config first: a missing model or untrusted code fails before any weights load
        data.check_model_config(path, revision=revision, trust_remote_code=trust, what="reward model")
        try:
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, revision=revision, **kw)
            if revision is not None:
                model._grpo_tokenizer = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust)
            return model
        except Exception as e:
            raise data._model_error(path, "reward model", e) from None
    except TrainerError as err:  # a reward that cannot be loaded is a reward error (12); 17 and 202 keep theirs
        raise TrainerError(REWARD if err.code == data.MODEL else err.code, err.message) from None


def processing_classes(funcs: list[Any]) -> list[Any] | None:
    """GRPOTrainer's reward_processing_classes: the tokenizer loaded with each pinned reward model, None for the rest
    (TRL loads those itself); None when there is none."""
    found = [getattr(f, "_grpo_tokenizer", None) for f in funcs]
    return found if any(t is not None for t in found) else None


def build(specs, *, max_completion_length: int, answer_column: str | None,
          init_kwargs: dict[str, Any] | None = None, pins: dict[tuple[str, str], str] | None = None) -> list[Any]:
    """The reward callables (and reward models) for TRL, in the order of the specs (their weights go to
    GRPOConfig.reward_weights)."""
    funcs: list[Any] = []
    for spec in specs:
        if getattr(spec, "model", None) is not None:
            funcs.append(load_reward_model(spec.model, init_kwargs, (pins or {}).get(("model", spec.model))))
        elif spec.function is not None:
            funcs.append(import_function(spec.function))
        elif spec.name == "accuracy":
            if answer_column is None:
                raise TrainerError(REWARD, "reward 'accuracy' needs the reference answers: set "
                                           "spec.dataset.answerColumn (e.g. answer)")
            funcs.append(accuracy)
        elif spec.name == "format":
            funcs.append(format)
        elif spec.name == "length":
            funcs.append(make_length(max_completion_length))
        else:
            raise TrainerError(REWARD, f"unknown built-in reward {spec.name!r}; use one of {', '.join(BUILTINS)} "
                                       "or a custom reward as function: module:function")
    return funcs
