"""Tiny models built offline from the example model: one that ships its own code (auto_map), and a reward model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.trainer import TINY_MODEL

# A Qwen2 subclass under its own model_type: transformers can load it only by running this file (trust_remote_code).
MODELING = '''
from transformers import Qwen2Config, Qwen2ForCausalLM


class TinyRemoteConfig(Qwen2Config):
    model_type = "tiny-remote"


class TinyRemoteForCausalLM(Qwen2ForCausalLM):
    config_class = TinyRemoteConfig
'''


def remote_code_model(dest: Path) -> Path:
    """The example model as a model that ships its own code: config.json's auto_map points at modeling_tiny.py."""
    shutil.copytree(TINY_MODEL, dest)
    (dest / "modeling_tiny.py").write_text(MODELING)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(model_type="tiny-remote", architectures=["TinyRemoteForCausalLM"],
               auto_map={"AutoConfig": "modeling_tiny.TinyRemoteConfig",
                         "AutoModelForCausalLM": "modeling_tiny.TinyRemoteForCausalLM"})
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    return dest


def reward_model(dest: Path, seed: int = 0) -> Path:
    """A random Qwen2 sequence classifier (one label) with the example model's tokenizer and chat template."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(TINY_MODEL, num_labels=1)
    model = AutoModelForSequenceClassification.from_config(cfg)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(TINY_MODEL).save_pretrained(dest)
    for extra in ("chat_template.jinja",):
        if (TINY_MODEL / extra).exists() and not (dest / extra).exists():
            shutil.copy(TINY_MODEL / extra, dest / extra)
    return dest
