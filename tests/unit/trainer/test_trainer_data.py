"""Datasets from local files/directories, column mapping to TRL's `prompt`, chat wrapping, model path errors."""

import json

import datasets
import pytest

from grpo_trainer import data
from grpo_trainer.config import DatasetSpec
from grpo_trainer.exitcodes import DATASET, MODEL, TrainerError
from tests.support.trainer import TINY_DATA, TINY_MODEL

ROWS = [{"question": f"What is {i} + 1 ?", "answer": f"#### {i + 1}"} for i in range(6)]


@pytest.fixture(params=["jsonl", "json", "parquet", "dir-jsonl", "save_to_disk", "save_to_disk-dict"])
def dataset_path(request, tmp_path):
    ds = datasets.Dataset.from_list(ROWS)
    kind = request.param
    if kind == "jsonl":
        p = tmp_path / "d.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "json":
        p = tmp_path / "d.json"
        p.write_text(json.dumps(ROWS))
    elif kind == "parquet":
        p = tmp_path / "d.parquet"
        ds.to_parquet(str(p))
    elif kind == "dir-jsonl":
        p = tmp_path / "dir"
        p.mkdir()
        (p / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "save_to_disk":
        p = tmp_path / "saved"
        ds.save_to_disk(str(p))
    else:
        p = tmp_path / "saved-dict"
        datasets.DatasetDict({"train": ds}).save_to_disk(str(p))
    return str(p)


def test_local_datasets_load_and_map(dataset_path):
    spec = DatasetSpec(name=dataset_path, prompt_column="question", answer_column="answer")
    ds = data.prepare_dataset(data.load_dataset(spec), spec, chat=False)
    assert len(ds) == 6 and ds[0]["prompt"] == "What is 0 + 1 ?" and ds[0]["answer"] == "#### 1"


def test_chat_wrapping_and_answer_copy():
    ds = datasets.Dataset.from_list([{"q": "hi", "solution": "#### 3", "answer": "old"}])
    spec = DatasetSpec(name="x", prompt_column="q", answer_column="solution")
    out = data.prepare_dataset(ds, spec, chat=True)
    assert out[0]["prompt"] == [{"role": "user", "content": "hi"}] and out[0]["answer"] == "#### 3"
    assert out[0]["solution"] == "#### 3"  # the original column stays for custom rewards


@pytest.mark.parametrize("spec, needle", [
    (DatasetSpec(name=str(TINY_DATA), prompt_column="q"), "has no column 'q' (spec.dataset.promptColumn); its columns "
                                                          "are: question, answer"),
    (DatasetSpec(name=str(TINY_DATA), prompt_column="question", answer_column="solution"),
     "has no column 'solution' (spec.dataset.answerColumn)"),
])
def test_missing_columns(spec, needle):
    with pytest.raises(TrainerError) as e:
        data.prepare_dataset(data.load_dataset(spec), spec, chat=False)
    assert e.value.code == DATASET and needle in e.value.message


def test_bad_dataset_paths(tmp_path):
    with pytest.raises(TrainerError, match="does not exist") as e:
        data.load_dataset(DatasetSpec(name=str(tmp_path / "nope.jsonl")))
    assert e.value.code == DATASET
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(TrainerError, match="unsupported extension .txt"):
        data.load_dataset(DatasetSpec(name=str(tmp_path / "d.txt")))
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(TrainerError):
        spec = DatasetSpec(name=str(tmp_path / "e.jsonl"))
        data.prepare_dataset(data.load_dataset(spec), spec, chat=False)


def test_tiny_tokenizer_has_chat_template_pad_and_eos():
    tok = data.load_tokenizer(str(TINY_MODEL))
    assert data.has_chat_template(tok) and tok.pad_token and tok.eos_token
    text = tok.apply_chat_template([{"role": "user", "content": "What is 1 + 2 ?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and tok.unk_token_id not in tok(text)["input_ids"]


def test_missing_model_path_is_permanent(tmp_path):
    with pytest.raises(TrainerError, match="does not exist") as e:
        data.load_tokenizer(str(tmp_path / "no-model"))
    assert e.value.code == MODEL
