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
from .peft import MODULE_NAME, PeftSpec  # noqa: F401 (MODULE_NAME: part of the api surface)
from .status import ConditionType, Phase, listing

GROUP = "grpo.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GRPOJob"
PLURAL = "grpojobs"
SINGULAR = "grpojob"
SHORT_NAMES = ["gj"]

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

# Kubernetes' own grammars (RE2-compatible: they also go into the CRD as `pattern`).
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY_RE = re.compile(
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
)
LABEL_VALUE_RE = re.compile(LABEL_VALUE)
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A model/dataset reference: a Hub id or a path. Printable, no whitespace or control characters. It travels only
# inside the config JSON (never in argv, never through a shell), so this is hygiene, not escaping.
# A leading '-' is refused so that no program can ever read the value as an option.
REF_PATTERN = r"^[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]*$"
# module.path:function — importable Python names only.
FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]*$"
# Absolute path of safe characters with no '..' segment (RE2 has no lookahead, hence the spelled-out form).
ABS_PATH_PATTERN = r"^(/([A-Za-z0-9_\-][A-Za-z0-9._\-]*|\.[A-Za-z0-9_\-][A-Za-z0-9._\-]*|\.\.[A-Za-z0-9._\-]+)?)+$"

BUILTIN_REWARDS = ("accuracy", "format", "length")

# A Kubernetes quantity: an int, or a string. GPUs must be whole numbers (rules/topology.py checks that).
Quantity = Union[StrictInt, StrictStr]


class _Model(BaseModel):
    """camelCase on the wire, no unknown fields (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=False, str_max_length=4096)


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


class ResourceRequirements(_Model):
    limits: dict[Annotated[str, Field(max_length=253)], Quantity] = Field(
        default_factory=dict,
        description="Per node (per pod) limits, e.g. {nvidia.com/gpu: 4, memory: 64Gi}. The GPU count sets "
        "nprocPerNode.",
    )
    requests: dict[Annotated[str, Field(max_length=253)], Quantity] = Field(
        default_factory=dict,
        description="Per node requests. For a GPU resource, requests must equal limits (Kubernetes requires it).",
    )


class VllmServerSpec(_Model):
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Resources of the vLLM server pod; its GPUs are NOT part of the training world size.",
    )
    port: Annotated[StrictInt, Field(ge=1024, le=65535)] = Field(default=8000, description="HTTP port of `vllm serve`.")
    image: Optional[Annotated[str, Field(max_length=512, pattern=IMAGE_PATTERN)]] = Field(
        default=None, description="Image of the vLLM server; defaults to the trainer image."
    )


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
        default=0.3, description="Fraction of GPU memory vLLM may use, in (0, 1]."
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


class SecretKeyRef(_Model):
    name: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="Secret name (same namespace).")
    key: Annotated[str, Field(min_length=1, max_length=253)] = Field(default="token", description="Key in the Secret.")


class EnvVar(_Model):
    name: Annotated[str, Field(min_length=1, max_length=256, pattern=ENV_NAME)] = Field(description="Variable name.")
    value: Optional[str] = Field(default=None, description="Literal value.")
    valueFrom: Optional[dict[str, Any]] = Field(
        default=None, description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, …)."
    )


class TemplateMetadata(_Model):
    labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if len(k) > 316 or not LABEL_KEY_RE.match(k) or len(k.rsplit("/", 1)[-1]) > 63:
                raise ValueError(f"label key {k!r} is not a valid Kubernetes label key")
            if not LABEL_VALUE_RE.match(val):
                raise ValueError(f"label {k}={val!r}: value must be ≤63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric")
        return v

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if len(k) > 316 or not LABEL_KEY_RE.match(k):
                raise ValueError(f"annotation key {k!r} is not a valid Kubernetes annotation key")
        return v


K8sObject = dict[str, Any]


class PodTemplate(_Model):
    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata, description="Extra pod labels and annotations.")
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[K8sObject] = Field(default_factory=list, description="Pod tolerations (Kubernetes Toleration objects).")
    affinity: Optional[K8sObject] = Field(default=None, description="Pod affinity (a Kubernetes Affinity object).")
    priorityClassName: Optional[Annotated[str, Field(max_length=253)]] = Field(default=None, description="Pod priority class.")
    schedulerName: Optional[Annotated[str, Field(max_length=253)]] = Field(default=None, description="Scheduler (e.g. a gang scheduler).")
    serviceAccountName: Optional[Annotated[str, Field(max_length=253)]] = Field(default=None, description="ServiceAccount of the trainer pods.")
    runtimeClassName: Optional[Annotated[str, Field(max_length=253)]] = Field(default=None, description="Runtime class.")
    imagePullSecrets: list[K8sObject] = Field(default_factory=list, description="Image pull secrets ({name: …}).")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables of the trainer container.")
    volumes: list[K8sObject] = Field(default_factory=list, description="Extra pod volumes (Kubernetes Volume objects).")
    volumeMounts: list[K8sObject] = Field(default_factory=list, description="Extra mounts in the trainer container.")
    shmSize: Optional[Quantity] = Field(
        default=None, description="Size of the /dev/shm emptyDir (NCCL needs more than the container default). Default 16Gi with GPUs."
    )


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
        tp = Literal[tuple(f.choices)] if f.choices else StrictStr  # type: ignore[misc]
    elif kind == "list[str]":
        tp = list[StrictStr]
    elif kind == "list[float]":
        tp = list[float]
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


class GRPOJobSpec(_Model):
    model: Annotated[str, Field(min_length=1, max_length=1024, pattern=REF_PATTERN)] = Field(
        description="Hugging Face Hub model id (e.g. Qwen/Qwen2.5-1.5B-Instruct) or a path inside the pod (e.g. on a PVC)."
    )
    dataset: DatasetSpec = Field(description="The prompt dataset.")
    rewards: Annotated[list[RewardSpec], Field(min_length=1, max_length=32)] = Field(
        description="Rewards (at least one): built-ins by name, custom module:function or reward models, with weights."
    )
    nodes: Annotated[StrictInt, Field(ge=1, le=1024)] = Field(default=1, description="Number of nodes (one torchrun pod per node).")
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
    template: PodTemplate = Field(default_factory=PodTemplate, description="Overrides for the trainer pods.")
    scheduling: Optional[SchedulingSpec] = Field(
        default=None, description="Gang scheduling with a PodGroup (coscheduling or Volcano); see docs/scheduling.md."
    )
    peft: Optional[PeftSpec] = Field(default=None, description="LoRA fine-tuning (PEFT): checkpoints and the output "
                                     "hold the adapter; absent: full fine-tuning. See docs/trainer.md.")

    @field_validator("training", mode="before")
    @classmethod
    def _known_training_fields(cls, v: Any) -> Any:
        if isinstance(v, dict):
            problems = []
            for key in v:
                if not isinstance(key, str):
                    problems.append(f"training argument names must be strings, got {key!r}")
                elif key in trl_fields.OWNED_BY_SPEC:
                    problems.append(f"'{key}' is set by the operator: {trl_fields.OWNED_BY_SPEC[key]}")
                elif key not in trl_fields.by_camel():
                    hint = trl_fields.suggest(key)
                    did = f"; did you mean '{hint}'?" if hint else ""
                    problems.append(f"'{key}' is not a TRL {trl_fields.trl_version()} GRPOConfig argument{did}")
            if problems:
                raise ValueError("; ".join(problems))
        return v


class Condition(BaseModel):
    type: str = Field(description=f"Condition type: {', '.join(ConditionType)}.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human readable message.")
    lastTransitionTime: Optional[str] = Field(default=None, description="When the status last changed (RFC 3339).")
    observedGeneration: Optional[int] = Field(default=None, description="The .metadata.generation the condition was set for.")


class BatchStatus(BaseModel):
    worldSize: int = Field(description="Training processes: nodes × nprocPerNode (vLLM server GPUs excluded).")
    nprocPerNode: int = Field(description="Training processes per node.")
    generationBatchSize: int = Field(description="Completions generated per generation round (TRL generation_batch_size).")
    stepsPerGeneration: int = Field(description="Optimizer steps per generation round.")
    promptsPerGeneration: int = Field(description="Distinct prompts per generation round (generationBatchSize / numGenerations).")


class ProgressStatus(BaseModel):
    model_config = ConfigDict(extra="allow")
    step: Optional[int] = Field(default=None, description="Current optimizer step.")
    maxSteps: Optional[int] = Field(default=None, description="Total steps.")
    reward: Optional[float] = Field(default=None, description="Mean reward at the last logging step.")
    rewardStd: Optional[float] = Field(default=None, description="Reward standard deviation.")
    rewards: Optional[dict[str, float]] = Field(
        default=None, description="Mean of each reward function at the last logging step (unweighted), by name.")
    kl: Optional[float] = Field(default=None, description="KL to the reference model.")
    completionLength: Optional[float] = Field(default=None, description="Mean completion length (tokens).")
    learningRate: Optional[float] = Field(default=None, description="Learning rate.")
    tokensPerSecond: Optional[float] = Field(default=None, description="Training throughput.")
    etaSeconds: Optional[float] = Field(default=None, description="Estimated seconds left.")
    updateTime: Optional[str] = Field(default=None, description="When the trainer logged this step (RFC 3339).")
    display: Optional[str] = Field(default=None, description="step/maxSteps, for the STEP column.")


class GRPOJobStatus(BaseModel):
    phase: Optional[Phase] = Field(default=None, description=f"{listing(Phase)}.")
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations (Kubernetes API conventions).")
    batch: Optional[BatchStatus] = Field(default=None, description="The batch breakdown the operator validated.")
    progress: Optional[ProgressStatus] = Field(default=None, description="Live training progress reported by global rank 0.")
    restarts: int = Field(default=0, description="Gang restarts so far.")
    requeues: int = Field(
        default=0, description="Of the restarts, those Kueue caused (it evicted the pods) or a resume under Kueue began; "
        "they do not count against runPolicy.backoffLimit.")
    lastFailureReason: Optional[str] = Field(default=None, description="Why the last pod failure happened.")
    topology: Optional[str] = Field(default=None, description="nodes×GPUs, for the NODES×GPUS column.")
    startTime: Optional[str] = Field(default=None, description="When the pods were first created.")
    completionTime: Optional[str] = Field(default=None, description="When the job finished.")
    observedGeneration: Optional[int] = Field(default=None, description="Last .metadata.generation acted on.")
    message: Optional[str] = Field(default=None, description="Human readable summary of the phase.")


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Optional[str] = None
    namespace: Optional[str] = None


class GRPOJob(BaseModel):
    """A validated job: the parsed spec plus the identity the renderer needs."""

    model_config = ConfigDict(extra="allow")
    apiVersion: Literal["grpo.dev/v1alpha1"] = API_VERSION
    kind: Literal["GRPOJob"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GRPOJobSpec
    status: Optional[dict[str, Any]] = None
