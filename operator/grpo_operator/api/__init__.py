"""The GRPOJob API: the single source of truth for spec and status.

pydantic models of spec/status (models), the CRD and its CEL rules generated from them (crd, cel), TRL's GRPOConfig
field table (trl_fields + data/). Pure: may import pydantic, yaml and the standard library; nothing else of
grpo_operator.
"""

from .models import (  # noqa: F401 — the package's public surface
    GROUP, VERSION, API_VERSION, KIND, PLURAL, SINGULAR, SHORT_NAMES, INT64_MAX, INT32_MAX, DNS1123_LABEL,
    DNS1123_SUBDOMAIN, LABEL_VALUE, LABEL_KEY_RE, LABEL_VALUE_RE, ENV_NAME, REF_PATTERN, FUNCTION_PATTERN,
    IMAGE_PATTERN, ABS_PATH_PATTERN, BUILTIN_REWARDS, Quantity, DatasetSpec, RewardSpec, ResourceRequirements,
    VllmServerSpec, VllmSpec, OutputSpec, RunPolicy, SecretKeyRef, EnvVar, TemplateMetadata, K8sObject,
    PodTemplate, SchedulingSpec, TrainingSpec, training_kwargs, GRPOJobSpec, Condition, BatchStatus, ProgressStatus, GRPOJobStatus,
    ObjectMeta, GRPOJob,
)
