"""Builds the tiny offline example assets: a WordLevel tokenizer with a chat template, a 2-layer Qwen2 model
(hidden 64, ~80k parameters, random weights) and a 64-prompt arithmetic dataset. Deterministic; no network.

    python examples/local-tiny/build_assets.py      # rewrites examples/local-tiny/{model,data}
"""

from __future__ import annotations

import json
import os
import random
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIAL = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
WORDS = ["what", "is", "the", "answer", "sum", "of", "and", "user", "assistant", "system", "think", "so", "it",
         "<think>", "</think>", "<answer>", "</answer>", "+", "-", "=", "?", ".", ",", "####", "\\boxed{", "}",
         "What", "The", "So", "\n"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(path: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS + [str(n) for n in range(100)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<|im_end|>", bos_token=None,
                                   additional_special_tokens=["<|im_start|>", "<|endoftext|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 256
    fast.save_pretrained(path)
    return fast


def build_model(path: str, tokenizer) -> int:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)
    model.save_pretrained(path, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def build_dataset(path: str, n: int = 64) -> None:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            f.write(json.dumps({"question": f"What is {a} + {b} ?", "answer": f"{a} + {b} = {a + b} . #### {a + b}"})
                    + "\n")


def main() -> None:
    model_dir, data_dir = os.path.join(HERE, "model"), os.path.join(HERE, "data")
    for d in (model_dir, data_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    tokenizer = build_tokenizer(model_dir)
    params = build_model(model_dir, tokenizer)
    build_dataset(os.path.join(data_dir, "arithmetic.jsonl"))
    print(f"model: {params} parameters, vocab {len(tokenizer)} -> {model_dir}")


if __name__ == "__main__":
    main()
