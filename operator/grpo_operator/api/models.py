"""The GRPOJob API (grpo.dev/v1alpha1): pydantic models of spec and status, the single source of truth.

The CRD (api/crd.py), the validator (rules/validation.py) and the renderer (render/manifests.py) all derive from these.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    create_model,
    field_validator,
    model_validator,
)

from . import trl_fields
from .base import (
    IMAGE_PATTERN,
    INT32_MAX,
    MAX_LIST,
    MAX_STR,
    ResourceRequirements,
    _Model,
)
from .parallelism import ParallelismSpec
from .peft import MODULE_NAME, PeftSpec  # noqa: F401 (MODULE_NAME: part of the api surface)
from .template import PodTemplate
from .vllm_server import VllmServerSpec

GROUP = "grpo.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GRPOJob"
PLURAL = "grpojobs"
SINGULAR = "grpojob"
SHORT_NAMES = ["gj"]

INT64_MAX = 2**63 - 1

# Kubernetes' own grammars (RE2-compatible: they also go into the CRD as `pattern`).
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY_RE = re.compile(
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
)
LABEL_VALUE_RE = re.compile(LABEL_VALUE)
# A model/dataset reference: a Hub id or a path. Printable, no whitespace or control characters. It travels only
# inside the config JSON (never in argv, never through a shell), so this is hygiene, not escaping.
# A leading '-' is refused so that no program can ever read the value as an option.
REF_PATTERN = r"^[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]*$"
# module.path:function — importable Python names only.
FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
# Absolute path of safe characters with no '..' segment (RE2 has no lookahead, hence the spelled-out form).
ABS_PATH_PATTERN = r"^(/([A-Za-z0-9_\-][A-Za-z0-9._\-]*|\.[A-Za-z0-9_\-][A-Za-z0-9._\-]*|\.\.[A-Za-z0-9._\-]+)?)+$"

BUILTIN_REWARDS = ("accuracy", "format", "length")

def _desc(text: str) -> Any:
    return Field(description=text)


class DatasetSpec(_Model):
    name: Annotated[str, Field(min_length=1, max_length=1024, pattern=REF_PATTERN)] = Field(
        description="Hugging Face Hub dataset id (e.g. openai/gsm8k) or a path inside the pod to a "
        "json/jsonl/parquet file or a directory of them."
    )
    config: Optional[Annotated[str, Field(min_length=1, max_length=256, pattern=REF_PATTERN)]] = Field(
        default=None, description="Dataset configuration name (the Hub's 'subset'), e.g. main."
    )
    split: Annotated[str, Field(min_length=1, max_length=256, pattern=REF_PATTERN)] = Field(
        default="train", description="Split to train on."
    )
    evalSplit: Optional[Annotated[str, Field(min_length=1, max_length=256, pattern=REF_PATTERN)]] = Field(
        default=None, description="Split to evaluate on (e.g. test): required when training.evalStrategy is not "
        "'no'; the trainer passes it to GRPOTrainer as eval_dataset."
    )
    evalName: Optional[Annotated[str, Field(min_length=1, max_length=1024, pattern=REF_PATTERN)]] = Field(
        default=None, description="The eval data when it is not in `name` (a Hub id or a path, e.g. a second jsonl "
        "file), read at evalSplit; config applies to `name` only. Default: name."
    )
    promptColumn: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        default="prompt", description="Column holding the prompt text (or chat messages)."
    )
    answerColumn: Optional[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default=None, description="Column holding the reference answer; passed to reward functions."
    )


class RewardSpec(_Model):
    name: Optional[Literal["accuracy", "format", "length"]] = Field(
        default=None,
        description="A built-in reward: accuracy (GSM8K '#### n' or \\boxed{n} answers compared numerically "
        "with answerColumn), format (reasoning/answer tags), length (prefers concise completions). "
        "Exactly one of name, function and model.",
    )
    function: Optional[Annotated[str, Field(max_length=512, pattern=FUNCTION_PATTERN)]] = Field(
        default=None,
        description="A custom reward 'module:function' importable in the trainer pod (e.g. from a "
        "ConfigMap mounted on PYTHONPATH). Exactly one of name, function and model.",
    )
    model: Optional[Annotated[str, Field(min_length=1, max_length=1024, pattern=REF_PATTERN)]] = Field(
        default=None,
        description="A reward model: Hugging Face Hub id or a path inside the pod, loaded as TRL does "
        "(AutoModelForSequenceClassification, num_labels=1; the score is its logit). Its metric is named after the "
        "last part of the id (rewards/<name>/mean); training.trustRemoteCode and modelInitKwargs' dtype and "
        "attn_implementation apply. Exactly one of name, function and model.",
    )
    weight: Annotated[float, Field(allow_inf_nan=False, ge=-1e6, le=1e6)] = Field(
        default=1.0, description="Weight of this reward in the sum (TRL's reward_weights)."
    )

    @model_validator(mode="after")
    def _one_of(self) -> RewardSpec:
        if sum(x is not None for x in (self.name, self.function, self.model)) != 1:
            raise ValueError("set exactly one of 'name' (a built-in: accuracy, format, length), 'function' (module:function) "
                             "or 'model' (a reward model's Hub id or path)")
        return self


class VllmSpec(_Model):
    mode: Literal["colocate", "server", "none"] = Field(
        default="colocate",
        description="colocate: every training process runs its own vLLM engine on its GPU (TRL's default); "
        "server: dedicated vLLM server pod(s), trainer rank 0 talks to it over HTTP; none: generate with "
        "transformers (slow; CPU jobs).",
    )
    tensorParallelSize: Annotated[StrictInt, Field(ge=1, le=64)] = Field(
        default=1, description="vLLM tensor parallel size. In colocate mode it must divide GPUs per node."
    )
    gpuMemoryUtilization: Annotated[float, Field(allow_inf_nan=False, gt=0, le=1)] = Field(
        default=0.3, description="Colocate mode: fraction of each training GPU vLLM may use, in (0, 1]. Server mode "
        "uses spec.vllm.server.gpuMemoryUtilization instead."
    )
    server: Optional[VllmServerSpec] = Field(default=None, description="Server mode: the vLLM server pod.")


class OutputSpec(_Model):
    volumeClaimName: Optional[Annotated[str, Field(max_length=253, pattern=DNS1123_SUBDOMAIN)]] = Field(
        default=None,
        description="PersistentVolumeClaim for checkpoints, shared by all nodes (ReadWriteMany for "
        "several nodes). Without it checkpoints live in an emptyDir and a restart starts over.",
    )
    path: Annotated[str, Field(min_length=1, max_length=1024, pattern=ABS_PATH_PATTERN)] = Field(
        default="/ckpt", description="Mount path; the trainer writes to <path>/<job name>."
    )


# A relative path of safe characters; no segment starts with '.', so no '..' (RE2 has no lookahead).
REL_PATH_PATTERN = r"^[A-Za-z0-9_\-][A-Za-z0-9._\-]*(/[A-Za-z0-9_\-][A-Za-z0-9._\-]*)*$"


class CacheSpec(_Model):
    volumeClaimName: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)] = Field(
        description="Your PersistentVolumeClaim for the Hugging Face cache (ReadWriteMany, or ReadWriteOnce on one "
        "node). A download pod fills it once per job; trainers and vLLM read it offline (docs/cache.md)."
    )
    subPath: Optional[Annotated[str, Field(min_length=1, max_length=1024, pattern=REL_PATH_PATTERN)]] = Field(
        default=None, description="Folder inside the claim to use as the cache (relative, no '..'); default: its root."
    )


class RunPolicy(_Model):
    backoffLimit: Annotated[StrictInt, Field(ge=0, le=1000)] = Field(
        default=3, description="Gang restarts after retryable failures before the job fails."
    )
    activeDeadlineSeconds: Optional[Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]] = Field(
        default=None, description="Fail the job (DeadlineExceeded) after this many seconds running."
    )
    ttlSecondsAfterFinished: Optional[Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]] = Field(
        default=None, description="Delete the finished job (and its pods) this many seconds after it ends."
    )
    suspend: StrictBool = Field(
        default=False, description="Suspended jobs have no pods; unsuspending recreates them and resumes from the checkpoint."
    )
    stallTimeoutSeconds: Optional[Annotated[StrictInt, Field(ge=60, le=INT32_MAX)]] = Field(
        default=None, description="A job whose step does not advance for this many seconds is Stalled (default: "
        "derived from its own step times; docs/operator.md).")
    restartPolicy: Literal["InPlace", "Recreate"] = Field(
        default="InPlace", description="How a gang restarts after a trainer process fails while its pods and nodes "
        "are healthy: InPlace (torchrun restarts the worker processes inside the running pods, which resume from the "
        "latest checkpoint; counted in status.inPlaceRestarts against backoffLimit) or Recreate (new pods every "
        "time). A lost, deleted, evicted or preempted pod is always recreated (docs/operator.md).")
    onStall: Literal["Restart", "Fail", "Ignore"] = Field(
        default="Restart", description="What a Stalled job does once every rank's stacks are dumped: Restart (a gang "
        "restart counted against backoffLimit, resuming from the checkpoint), Fail, or Ignore (the condition only).")


class SecretKeyRef(_Model):
    name: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="Secret name (same namespace).")
    key: Annotated[str, Field(min_length=1, max_length=253)] = Field(default="token", description="Key in the Secret.")


class SchedulingSpec(_Model):
    """Gang scheduling without Kueue (docs/scheduling.md). Under Kueue (the job's kueue.x-k8s.io/queue-name label)
    the pods form a Kueue pod group instead, and this stays unset."""

    gang: Optional[Literal["coscheduling", "volcano"]] = Field(
        default=None,
        description="coscheduling: a scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1); volcano: a Volcano "
        "PodGroup (scheduling.volcano.sh/v1beta1) and schedulerName volcano. Absent: no gang scheduling.",
    )
    scheduleTimeoutSeconds: Optional[Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]] = Field(
        default=None, description="coscheduling only: how long the gang's pods wait at Permit for the rest of it."
    )
    queue: Optional[Annotated[str, Field(max_length=253, pattern=DNS1123_SUBDOMAIN)]] = Field(
        default=None, description="volcano only: the Volcano Queue (default: default)."
    )
    priorityClassName: Optional[Annotated[str, Field(max_length=253, pattern=DNS1123_SUBDOMAIN)]] = Field(
        default=None, description="volcano only: the PodGroup's PriorityClass (default: template.priorityClassName)."
    )

    @model_validator(mode="after")
    def _fields_of_the_chosen_gang(self) -> SchedulingSpec:
        problems = []
        if self.scheduleTimeoutSeconds is not None and self.gang != "coscheduling":
            problems.append("scheduleTimeoutSeconds is a coscheduling PodGroup field: set gang: coscheduling or remove it")
        for name in ("queue", "priorityClassName"):
            if getattr(self, name) is not None and self.gang != "volcano":
                problems.append(f"{name} is a Volcano PodGroup field: set gang: volcano or remove it")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _training_field(f: trl_fields.TrlField) -> tuple[Any, Any]:
    kind = f.kind
    if kind == "bool":
        tp: Any = StrictBool
    elif kind == "int":
        tp = Annotated[StrictInt, Field(ge=-INT64_MAX, le=INT64_MAX)]
    elif kind == "float":
        tp = Annotated[float, Field(allow_inf_nan=False)]
    elif kind == "str":
        tp = Literal[tuple(f.choices)] if f.choices else Annotated[StrictStr, Field(max_length=MAX_STR)]
    elif kind == "list[str]":
        tp = Annotated[list[Annotated[StrictStr, Field(max_length=MAX_STR)]], Field(max_length=MAX_LIST)]
    elif kind == "list[float]":
        tp = Annotated[list[float], Field(max_length=MAX_LIST)]
    elif kind == "dict":
        tp = dict[str, Any]
    elif kind == "int-or-string":
        tp = Union[Annotated[StrictInt, Field(ge=-INT64_MAX, le=INT64_MAX)], StrictStr]
    else:
        tp = Any
    if f.nullable or kind == "any":
        tp = Optional[tp]
    desc = f"TRL GRPOConfig.{f.name}. {f.help}".strip()
    if len(desc) > 600:
        desc = desc[:597] + "…"
    return (tp, Field(default=None, description=desc))


def _build_training_model() -> type[BaseModel]:
    defs = {f.camel: _training_field(f) for f in trl_fields.fields() if f.camel not in trl_fields.OWNED_BY_SPEC}
    model = create_model(  # type: ignore[call-overload]
        "TrainingSpec",
        __config__=ConfigDict(extra="forbid"),
        __doc__=f"TRL {trl_fields.trl_version()} GRPOConfig arguments by their camelCase names.",
        **defs,
    )
    return model


TrainingSpec = _build_training_model()


def training_kwargs(training: BaseModel) -> dict[str, Any]:
    """The user's training arguments under TRL's snake_case names (only those set)."""
    by_camel = trl_fields.by_camel()
    return {by_camel[k].name: v for k, v in training.model_dump(exclude_unset=True).items()}


# A review's cost and message are bounded whatever a tenant sends (a flood of unknown training keys): the first
# problems are named (with a "did you mean" each), the rest only counted.
MAX_TRAINING_PROBLEMS = 8
MAX_SUGGESTED_NAME = 64  # longer names are no typo of a TRL argument: no fuzzy match is computed for them


class GRPOJobSpec(_Model):
    model: Annotated[str, Field(min_length=1, max_length=1024, pattern=REF_PATTERN)] = Field(
        description="Hugging Face Hub model id (e.g. Qwen/Qwen2.5-1.5B-Instruct) or a path inside the pod (e.g. on a PVC)."
    )
    dataset: DatasetSpec = Field(description="The prompt dataset.")
    rewards: Annotated[list[RewardSpec], Field(min_length=1, max_length=32)] = Field(
        description="Rewards (at least one): built-ins by name, custom module:function or reward models, with weights."
    )
    nodes: Annotated[StrictInt, Field(ge=1, le=1024)] = Field(
        default=1, description="Number of nodes (one torchrun pod per node).")
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Per node resources (a standard ResourceRequirements). The GPU count (nvidia.com/gpu, "
        "amd.com/gpu or another */gpu resource) sets nprocPerNode.",
    )
    nprocPerNode: Optional[Annotated[StrictInt, Field(ge=1, le=1024)]] = Field(
        default=None,
        description="Training processes per node. Optional: derived from the GPU count, which it must equal "
        "when given; CPU-only jobs default to 1.",
    )
    training: TrainingSpec = Field(  # type: ignore[valid-type]
        default_factory=TrainingSpec,
        description=f"TRL {trl_fields.trl_version()} GRPOConfig arguments by their camelCase names "
        "(perDeviceTrainBatchSize, numGenerations, learningRate, maxSteps, …), type-checked.",
    )
    vllm: VllmSpec = Field(default_factory=VllmSpec, description="Generation with vLLM.")
    image: Optional[Annotated[str, Field(max_length=512, pattern=IMAGE_PATTERN)]] = Field(
        default=None, description="Trainer image; defaults to the operator's configured trainer image."
    )
    output: OutputSpec = Field(default_factory=OutputSpec, description="Where checkpoints go (shared by all nodes).")
    runPolicy: RunPolicy = Field(default_factory=RunPolicy, description="Restarts, deadline, TTL, suspend.")
    hfTokenSecretRef: Optional[SecretKeyRef] = Field(
        default=None, description="Secret holding a Hugging Face token; it reaches the pods as HF_TOKEN by secretKeyRef."
    )
    template: PodTemplate = Field(default_factory=PodTemplate, description="The pods' template: placement, security, "
                                  "environment and extra containers (docs/pod-template.md says which pods get what).")
    scheduling: Optional[SchedulingSpec] = Field(
        default=None, description="Gang scheduling with a PodGroup (coscheduling or Volcano); see docs/scheduling.md."
    )
    cache: Optional[CacheSpec] = Field(
        default=None, description="Stage the model, reward models and dataset once onto a shared volume: a download "
        "pod fills it, trainers and vLLM read it offline, restarts download nothing (docs/cache.md)."
    )
    peft: Optional[PeftSpec] = Field(default=None, description="LoRA fine-tuning (PEFT): checkpoints and the output "
                                     "hold the adapter; absent: full fine-tuning. See docs/trainer.md.")
    parallelism: Optional[ParallelismSpec] = Field(
        default=None, description="Sharded training preset (zero3, fsdp; ddp the default), rendered into TRL's "
        "deepspeed / fsdp arguments; not together with training.deepspeed, fsdp or fsdpConfig. See docs/trainer.md.")

    @field_validator("training", mode="before")
    @classmethod
    def _known_training_fields(cls, v: Any) -> Any:
        if isinstance(v, dict):
            problems: list[str] = []
            more = 0
            for key in v:
                if len(problems) >= MAX_TRAINING_PROBLEMS:  # a flood of keys: count the rest, suggest nothing more
                    more += not isinstance(key, str) or key in trl_fields.OWNED_BY_SPEC or key not in trl_fields.by_camel()
                elif not isinstance(key, str):
                    problems.append(f"training argument names must be strings, got {key!r:.60}")
                elif key in trl_fields.OWNED_BY_SPEC:
                    problems.append(f"'{key}' is set by the operator: {trl_fields.OWNED_BY_SPEC[key]}")
                elif trl_fields.removed(key):
                    problems.append(str(trl_fields.removed(key)))
                elif key not in trl_fields.by_camel():
                    hint = trl_fields.suggest(key) if len(key) <= MAX_SUGGESTED_NAME else None
                    did = f"; did you mean '{hint}'?" if hint else ""
                    problems.append(f"'{key:.60}' is not a TRL {trl_fields.trl_version()} GRPOConfig argument{did}")
            if more:
                problems.append(f"and {more} more unknown training argument(s)")
            if problems:  # one per line: the error formatter shows each as an error of its own
                raise ValueError("\n".join(problems))
        return v


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Optional[str] = None
    namespace: Optional[str] = None


class GRPOJob(BaseModel):
    """A validated job: the parsed spec plus the identity the renderer needs."""

    model_config = ConfigDict(extra="allow")
    apiVersion: Literal["grpo.dev/v1alpha1"] = "grpo.dev/v1alpha1"  # == API_VERSION (asserted below)
    kind: Literal["GRPOJob"] = "GRPOJob"  # == KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GRPOJobSpec
    status: Optional[dict[str, Any]] = None


# the Literal defaults of GRPOJob spell API_VERSION and KIND out (a Literal cannot name a constant)
assert (GRPOJob.model_fields["apiVersion"].default, GRPOJob.model_fields["kind"].default) == (API_VERSION, KIND)
