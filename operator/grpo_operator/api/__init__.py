"""The GRPOJob API: the single source of truth for spec and status.

pydantic models of spec/status (models, template), the CRD and its CEL rules generated from them (crd, cel), TRL's
GRPOConfig field table (trl_fields + data/). Pure: may import pydantic, yaml and the standard library; nothing else of
grpo_operator.
"""

from .base import IMAGE_PATTERN, INT32_MAX, Quantity, ResourceRequirements
from .models import (
    ABS_PATH_PATTERN,
    API_VERSION,
    BUILTIN_REWARDS,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    FUNCTION_PATTERN,
    GROUP,
    INT64_MAX,
    KIND,
    LABEL_KEY_RE,
    LABEL_VALUE,
    LABEL_VALUE_RE,
    PLURAL,
    REF_PATTERN,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    CacheSpec,
    DatasetSpec,
    GRPOJob,
    GRPOJobSpec,
    ObjectMeta,
    OutputSpec,
    RewardSpec,
    RunPolicy,
    SchedulingSpec,
    SecretKeyRef,
    TrainingSpec,
    VllmSpec,
    training_kwargs,
)
from .parallelism import ParallelismSpec
from .peft import MODULE_NAME, PeftSpec
from .status_models import (
    BatchStatus,
    Condition,
    ConditionStatus,
    GRPOJobStatus,
    InPlaceCount,
    ProgressStatus,
    StagedRevision,
    parse_lenient,
    parse_status,
)
from .template import ENV_NAME, EnvVar, ExtraContainer, K8sObject, PodTemplate, TemplateMetadata
from .vllm_server import VllmServerSpec

# the package's public surface (explicit, so that mypy's no_implicit_reexport accepts `api.X`)

__all__ = [
    "ABS_PATH_PATTERN", "API_VERSION", "BUILTIN_REWARDS", "DNS1123_LABEL", "DNS1123_SUBDOMAIN", "ENV_NAME",
    "FUNCTION_PATTERN", "GROUP", "IMAGE_PATTERN", "INT32_MAX", "INT64_MAX", "KIND", "LABEL_KEY_RE", "LABEL_VALUE",
    "LABEL_VALUE_RE", "PLURAL", "REF_PATTERN", "SHORT_NAMES", "SINGULAR", "VERSION", "BatchStatus", "Condition",
    "DatasetSpec", "EnvVar", "ExtraContainer", "GRPOJob", "GRPOJobSpec", "GRPOJobStatus", "K8sObject", "ObjectMeta", "OutputSpec",
    "PodTemplate", "ProgressStatus", "Quantity", "ResourceRequirements", "RewardSpec", "RunPolicy", "SchedulingSpec",
    "SecretKeyRef", "TemplateMetadata", "TrainingSpec", "VllmServerSpec", "VllmSpec", "training_kwargs", "CacheSpec",
    "MODULE_NAME", "PeftSpec", "ConditionStatus", "parse_lenient", "parse_status", "ParallelismSpec",
    "StagedRevision", "InPlaceCount",
]
