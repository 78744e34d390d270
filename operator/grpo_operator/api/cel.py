"""CEL validation rules (x-kubernetes-validations) for the GRPOJob CRD, as data.

crd.py merges them into the generated schema (``apply``). They let the API server itself refuse the plainest
errors even where the admission webhook is not installed; the webhook (rules/validation.py) stays the complete check
and the source of the detailed messages (valid values, smallest fixes). Every rule here must only refuse objects
the validator refuses too: where CEL cannot tell (a GPU count it cannot parse, a product that could overflow),
the rule passes and the webhook decides.

Portability (checked on apiextensions-apiserver 1.36, see tests/chart/test_cel.py): Kubernetes compiles new CRD
expressions against an environment one or more minor versions back (1.29 compiles with the 1.28 libraries), so
the rules use only base CEL, macros, ``matches`` and ``int()``: no ``cel.bind``, no ``format`` (its strings
library version arrived in 1.29), no quantity library. No ``messageExpression`` either: string concatenation
with ``string(int)`` is estimated over the cost budget, so the messages are static and name the fields.

Cost: the CEL cost estimator needs bounds on everything a rule iterates or matches. ``SCHEMA_BOUNDS`` adds them
(maxProperties on resource maps, maxLength on quantity values); they are generous (Kubernetes itself refuses a
64-character quantity in a pod).
"""

from __future__ import annotations

from typing import Any

# The validator's GPU resource names (topology.GPU_RESOURCE_RE) and whole-number GPU counts.
GPU_RE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/gpu$"
WHOLE_RE = r"^[+]?[0-9]{1,10}$"  # what CEL's int() parses (no surrounding spaces)
WHOLE_LOOSE_RE = r"^\\s*[+]?[0-9]+\\s*$"  # the validator strips spaces (and allows ≤ 10 characters in all)
MAX_RESOURCE_NAMES = 64
MAX_QUANTITY_LENGTH = 64
# Products must stay below 2^63: with nodes, GPUs per node ≤ 1024 (the validator's bounds) and these factor
# bounds, P × W × S ≤ 2^20 × 2^20 × 2^20. Larger values skip the divisibility rules (the webhook checks them).
FACTOR_MAX = 2**20

IMMUTABLE_HINT = (
    "cannot change on an existing job: its pods, topology and batch were set up from it. To change it, "
    "delete the job and create a new one (it resumes from the checkpoints in spec.output)."
)

TRL_E2 = "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time"
TRL_E0 = (
    "auto_find_batch_size is not supported by GRPO, because the generation batch must contain full prompt groups "
    "of num_generations completions, and reducing the batch size on out-of-memory breaks this invariant. Set "
    "auto_find_batch_size=False and lower per_device_train_batch_size instead."
)
TRL_E5 = (
    "GRPO requires at least 2 generations per prompt to calculate the advantages: numGenerations must be at least 2."
)
TRL_E4 = (
    "generation_batch_size must be divisible by num_generations: generation_batch_size = perDeviceTrainBatchSize "
    "× world size (nodes × GPUs per node) × stepsPerGeneration (default gradientAccumulationSteps) when "
    "generationBatchSize is not set. Run `grpojob check` for the valid numGenerations and the smallest fixes."
)
TRL_E1 = (
    "generation_batch_size must be divisible by the global batch size (perDeviceTrainBatchSize × world size, "
    "world size = nodes × GPUs per node). Run `grpojob check` for the smallest fixes."
)
GPU_WHOLE = 'GPU count must be a whole number of GPUs (an integer like 4 or "4").'


def _at_least_one(field: str) -> dict[str, Any]:
    return {
        "rule": f"!has(self.{field}) || self.{field} >= 1",
        "message": f"{field} must be at least 1.",
        "fieldPath": f".{field}",
        "reason": "FieldValueInvalid",
    }


# ---------------------------------------------------------------------------------------------- expressions
# Written as Python templates because 1.28-compatible CEL has no let-bindings (cel.bind).
_HAS_L = "has(self.resources) && has(self.resources.limits)"
_HAS_R = "has(self.resources) && has(self.resources.requests)"
_GPU_KEYS_L = f"self.resources.limits.filter(k, k.matches('{GPU_RE}'))"
_NO_GPU = (f"!({_HAS_L} && self.resources.limits.exists(k, k.matches('{GPU_RE}')))"
           f" && !({_HAS_R} && self.resources.requests.exists(k, k.matches('{GPU_RE}')))")
_GPU_V = f"self.resources.limits[{_GPU_KEYS_L}[0]]"
# GPUs per node from the one GPU resource in limits: an int, or a string CEL's int() parses; else 0 (unknown).
_GPU_N = f"(type({_GPU_V}) == int ? {_GPU_V} : ({_GPU_V}.matches('{WHOLE_RE}') ? int({_GPU_V}) : 0))"
_NPROC = f"({_NO_GPU} ? (has(self.nprocPerNode) ? self.nprocPerNode : 1) : {_GPU_N})"
# nproc is known: a CPU job, or exactly one GPU resource in limits with a count in [1, 1024].
_NPROC_KNOWN = f"(({_NO_GPU}) || ({_HAS_L} && {_GPU_KEYS_L}.size() == 1 && {_GPU_N} >= 1 && {_GPU_N} <= 1024))"
_NODES = "(has(self.nodes) ? self.nodes : 1)"
_W = f"({_NODES} * {_NPROC})"
# TRL defaults (trl_fields): per_device_train_batch_size 8, gradient_accumulation_steps 1, num_generations 8.
_P = "(has(self.training.perDeviceTrainBatchSize) ? self.training.perDeviceTrainBatchSize : 8)"
_A = "(has(self.training.gradientAccumulationSteps) ? self.training.gradientAccumulationSteps : 1)"
_G = "(has(self.training.numGenerations) ? self.training.numGenerations : 8)"
_S = f"(has(self.training.stepsPerGeneration) ? self.training.stepsPerGeneration : {_A})"
_B = "self.training.generationBatchSize"
_FACTORS_OK = (f"{_P} >= 1 && {_P} <= {FACTOR_MAX} && {_S} >= 1 && {_S} <= {FACTOR_MAX} && {_G} >= 1"
               f" && {_NODES} <= 1024")
# Skip (pass) unless the batch is computable exactly as TRL computes it.
_SKIP = f"!has(self.training) || !({_NPROC_KNOWN}) || !({_FACTORS_OK})"

E4_DERIVED = (f"{_SKIP} || has({_B}) || ({_P} * {_W} * {_S}) % {_G} == 0")
E1 = (f"{_SKIP} || !has({_B}) || has(self.training.stepsPerGeneration) || {_B} < 1"
      f" || {_B} % ({_P} * {_W}) == 0")
E4_GIVEN = (f"{_SKIP} || !has({_B}) || has(self.training.stepsPerGeneration) || {_B} < 1"
            f" || {_B} % ({_P} * {_W}) != 0 || {_B} % {_G} == 0")


def _gpu_whole_rule() -> dict[str, Any]:
    v = "self[k]"
    return {
        "rule": (f"self.all(k, !k.matches('{GPU_RE}') || (type({v}) == int ? {v} >= 0 : "
                 f"(size({v}) <= 10 && {v}.matches('{WHOLE_LOOSE_RE}'))))"),
        "message": GPU_WHOLE,
        "reason": "FieldValueInvalid",
    }


def _immutable(field: str) -> dict[str, Any]:
    """Root-level transition rule: spec.<field> is fixed once the job exists, unless the operator Rejected it
    (an invalid job never had pods and may be fixed in place, as the webhook allows)."""
    return {
        "rule": (f"(has(oldSelf.status) && has(oldSelf.status.phase) && oldSelf.status.phase == 'Rejected')"
                 f" || (has(self.spec.{field}) == has(oldSelf.spec.{field})"
                 f" && (!has(self.spec.{field}) || self.spec.{field} == oldSelf.spec.{field}))"),
        "message": f"spec.{field} {IMMUTABLE_HINT}",
        "fieldPath": f".spec.{field}",
        "reason": "FieldValueForbidden",
    }


BATCH_FIELDS = ("perDeviceTrainBatchSize", "gradientAccumulationSteps", "numGenerations", "stepsPerGeneration",
                "generationBatchSize")


def _immutable_batch() -> dict[str, Any]:
    t, o = "self.spec.training", "oldSelf.spec.training"
    same = " && ".join(f"has({t}.{f}) == has({o}.{f}) && (!has({t}.{f}) || {t}.{f} == {o}.{f})"
                       for f in BATCH_FIELDS)
    return {
        "rule": (f"(has(oldSelf.status) && has(oldSelf.status.phase) && oldSelf.status.phase == 'Rejected')"
                 f" || (has(self.spec.training) == has(oldSelf.spec.training)"
                 f" && (!has(self.spec.training) || ({same})))"),
        "message": f"spec.training batch sizes ({', '.join(BATCH_FIELDS)}) {IMMUTABLE_HINT}",
        "fieldPath": ".spec.training",
        "reason": "FieldValueForbidden",
    }


# Schema path (dot-separated property names; "*" = additionalProperties) → rules at that node.
RULES: dict[str, list[dict[str, Any]]] = {
    "": [_immutable("model"), _immutable("dataset"), _immutable("nodes"), _immutable("nprocPerNode"),
         _immutable("resources"), _immutable("vllm"), _immutable_batch()],
    "spec": [
        {"rule": E4_DERIVED, "message": TRL_E4, "fieldPath": ".training.numGenerations", "reason": "FieldValueInvalid"},
        {"rule": E1, "message": TRL_E1, "fieldPath": ".training.generationBatchSize", "reason": "FieldValueInvalid"},
        {"rule": E4_GIVEN, "message": TRL_E4.split(":")[0] + ". Run `grpojob check` for the valid numGenerations.",
         "fieldPath": ".training.numGenerations", "reason": "FieldValueInvalid"},
    ],
    "spec.training": [
        {"rule": "!has(self.numGenerations) || self.numGenerations >= 2", "message": TRL_E5,
         "fieldPath": ".numGenerations", "reason": "FieldValueInvalid"},
        {"rule": "!has(self.generationBatchSize) || !has(self.stepsPerGeneration)", "message": TRL_E2,
         "fieldPath": ".generationBatchSize", "reason": "FieldValueInvalid"},
        {"rule": "!has(self.autoFindBatchSize) || !self.autoFindBatchSize", "message": TRL_E0,
         "fieldPath": ".autoFindBatchSize", "reason": "FieldValueInvalid"},
        _at_least_one("perDeviceTrainBatchSize"),
        _at_least_one("gradientAccumulationSteps"),
        _at_least_one("stepsPerGeneration"),
        _at_least_one("generationBatchSize"),
    ],
    "spec.resources.limits": [_gpu_whole_rule()],
    "spec.resources.requests": [_gpu_whole_rule()],
    "spec.vllm.server.resources.limits": [_gpu_whole_rule()],
    "spec.vllm.server.resources.requests": [_gpu_whole_rule()],
}

# Bounds the cost estimator needs (see the module docstring).
_MAP = {"maxProperties": MAX_RESOURCE_NAMES}
_QTY = {"maxLength": MAX_QUANTITY_LENGTH}
SCHEMA_BOUNDS: dict[str, dict[str, Any]] = {}
for _prefix in ("spec.resources", "spec.vllm.server.resources"):
    for _which in ("limits", "requests"):
        SCHEMA_BOUNDS[f"{_prefix}.{_which}"] = _MAP
        SCHEMA_BOUNDS[f"{_prefix}.{_which}.*"] = _QTY


def _node(root: dict[str, Any], path: str) -> dict[str, Any]:
    node = root
    for part in filter(None, path.split(".")):
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
    return node


def apply(root: dict[str, Any]) -> dict[str, Any]:
    """Add SCHEMA_BOUNDS and RULES to the openAPIV3Schema ``root`` (in place; also returned)."""
    for path, bounds in SCHEMA_BOUNDS.items():
        _node(root, path).update(bounds)
    for path, rules in RULES.items():
        if rules:
            _node(root, path)["x-kubernetes-validations"] = [dict(r) for r in rules]
    return root
