"""Builds the tiny offline example assets: a byte-level BPE tokenizer with a chat template, a 2-layer Qwen2 model
(hidden 64, ~95k parameters; 2 attention heads of size 32 and 1 KV head, because vLLM's CPU attention supports head
sizes of 32 and more) and a 64-prompt arithmetic dataset. No network; a few seconds on a CPU.

The model gets a short supervised warm start on "What is a + b ?" -> "a + b = c . #### c" chats, so that its
completions end with the eos token and sometimes hold the right answer: GRPO then sees reward variance within
groups (a random model never stops, every completion is clipped and every reward is the same).

    python examples/local-tiny/build_assets.py      # rewrites examples/local-tiny/{model,data}
"""

from __future__ import annotations

import json
import os
import random
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIAL = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus() -> list[str]:
    """Every chat the example can produce, the text the tokenizer is trained on."""
    out = []
    for a in range(21):
        for b in range(21):
            out.append(f"<|im_start|>user\nWhat is {a} + {b} ?<|im_end|>\n<|im_start|>assistant\n"
                       f"<think> {a} + {b} = {a + b} </think> <answer> {a} + {b} = {a + b} . #### {a + b} </answer>"
                       f" \\boxed{{{a + b}}}<|im_end|>\n")
    return out


def build_tokenizer(path: str):
    """A byte-level BPE trained on the corpus (the scheme Qwen2's tokenizer class rebuilds from vocab + merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
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
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(config)
    warm_start(model, tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)
    model.save_pretrained(path, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def warm_start(model, tokenizer, steps: int = 300, batch: int = 32) -> None:
    """A few hundred supervised steps on chats covering every a + b with a, b in 0..20."""
    import torch

    rng = random.Random(1)
    pairs = [(a, b) for a in range(21) for b in range(21)]
    texts = [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"What is {a} + {b} ?"},
         {"role": "assistant", "content": f"{a} + {b} = {a + b} . #### {a + b}"}], tokenize=False) for a, b in pairs]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        enc = tokenizer(rng.sample(texts, batch), return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    print(f"warm start: final loss {loss.item():.3f}")


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
    build_tokenizer(model_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # exactly what the trainer will load (Qwen2Tokenizer)
    params = build_model(model_dir, tokenizer)
    build_dataset(os.path.join(data_dir, "arithmetic.jsonl"))
    print(f"model: {params} parameters, vocab {len(tokenizer)} -> {model_dir}")


if __name__ == "__main__":
    main()
