"""Loads the model, tokenizer and dataset (Hub id or local path) and maps the dataset to TRL's `prompt` column."""

from __future__ import annotations

import os

from .config import DatasetSpec
from .exitcodes import DATASET, MODEL, REMOTE_CODE, TRANSIENT_IO, TrainerError

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def _is_transient(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, (ConnectionError, TimeoutError)) or any(
        m in text for m in ("connection error", "connecterror", "timed out", "temporarily unavailable",
                            "503", "502", "504", "429"))


def load_dataset(spec: DatasetSpec, cache_dir: str | None = None):
    """The split as a `datasets.Dataset`: a json/jsonl/parquet/csv file, a directory, or a Hub id (from `cache_dir`
    when given: the staged commit's own datasets cache, pins.py)."""
    import datasets

    name = spec.name
    try:
        if os.path.isfile(name):
            ext = os.path.splitext(name)[1].lower()
            builder = _FILE_BUILDERS.get(ext)
            if builder is None:
                raise TrainerError(DATASET, f"dataset file {name}: unsupported extension {ext or '(none)'}; "
                                            f"use one of {', '.join(sorted(_FILE_BUILDERS))}")
            return datasets.load_dataset(builder, data_files={spec.split: name}, split=spec.split)
        if os.path.isdir(name) and any(os.path.exists(os.path.join(name, f))
                                       for f in ("state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(name)  # a directory written by Dataset(Dict).save_to_disk
            return ds[spec.split] if isinstance(ds, datasets.DatasetDict) else ds
        if name.startswith(("/", "./", "../")) and not os.path.exists(name):
            raise TrainerError(DATASET, f"dataset path {name} does not exist (mount it into the pod, or use a Hub id)")
        return datasets.load_dataset(name, spec.config, split=spec.split, cache_dir=cache_dir)
    except TrainerError:
        raise
    except Exception as e:
        if _is_transient(e):
            raise TrainerError(TRANSIENT_IO, f"dataset {name}: {type(e).__name__}: {e}") from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainerError(DATASET, f"cannot load dataset {name!r} (config {spec.config!r}, split {spec.split!r}): "
                                    f"{first}") from None


def prepare_dataset(ds, spec: DatasetSpec, *, chat: bool):
    """Rename promptColumn to `prompt`, copy answerColumn to `answer`, wrap prompts as chat messages if `chat`."""
    columns = list(ds.column_names)
    missing = [c for c in (spec.prompt_column, spec.answer_column) if c is not None and c not in columns]
    if missing:
        which = "promptColumn" if missing[0] == spec.prompt_column else "answerColumn"
        raise TrainerError(DATASET, f"dataset {spec.name!r} has no column {missing[0]!r} (spec.dataset.{which}); "
                                    f"its columns are: {', '.join(columns)}")
    if len(ds) == 0:
        raise TrainerError(DATASET, f"dataset {spec.name!r} split {spec.split!r} is empty")
    if spec.answer_column is not None and spec.answer_column != "answer":
        if "answer" in columns:
            ds = ds.remove_columns("answer")
        ds = ds.add_column("answer", ds[spec.answer_column])
    if spec.prompt_column != "prompt":
        if "prompt" in columns:
            ds = ds.remove_columns("prompt")
        ds = ds.rename_column(spec.prompt_column, "prompt")
    if chat and isinstance(ds[0]["prompt"], str):
        ds = ds.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})
    return ds


def check_model_config(model: str, *, revision: str | None = None, trust_remote_code: bool = False,
                       what: str = "model") -> None:
    """Read the model's config first (seconds, no weights): a missing model, or one that ships its own code while
    trustRemoteCode is off, is a permanent error now instead of after the other models have loaded."""
    from transformers import AutoConfig

    check_model_path(model)
    try:
        AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise _model_error(model, what, e) from None


def load_tokenizer(model: str, *, revision: str | None = None, trust_remote_code: bool = False):
    """The tokenizer (or processor) by Hub id or path, with a pad token (falls back to eos)."""
    from transformers import AutoTokenizer

    check_model_path(model)
    try:
        tok = AutoTokenizer.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise _model_error(model, "tokenizer", e) from None
    if getattr(tok, "pad_token", None) is None and getattr(tok, "eos_token", None) is not None:
        tok.pad_token = tok.eos_token
    return tok


def check_model_path(model: str) -> None:
    """A model given as a path must exist: say so instead of Hub's "Repo id must be in the form" message."""
    if model.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(model)):
        raise TrainerError(MODEL, f"model path {model} does not exist or is not a directory "
                                  "(mount the volume that holds it, or use a Hub id)")


def load_model(model: str, **init_kwargs):
    """The causal LM by Hub id or path (a PEFT adapter directory loads its base model plus the adapter)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(model, **init_kwargs)
    except Exception as e:
        raise _model_error(model, "model", e) from None


def _model_error(model: str, what: str, e: BaseException) -> TrainerError:
    if isinstance(e, ValueError) and "trust_remote_code" in str(e):
        return TrainerError(REMOTE_CODE, f"the {what} {model!r} ships its own code (auto_map in its config.json) and "
                                         "spec.training.trustRemoteCode is not true: set trustRemoteCode: true if you "
                                         "trust that code (it runs in every trainer pod and vLLM), or use a model "
                                         "that transformers supports natively")
    if _is_transient(e):
        return TrainerError(TRANSIENT_IO, f"{what} {model}: {type(e).__name__}: {e}")
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return TrainerError(MODEL, f"cannot load the {what} {model!r}: {first}")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))
