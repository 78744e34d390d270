"""spec.vllm.server: the dedicated vLLM server pod of server mode, sized as a server (its own memory fraction,
context length, prefix caching, data parallelism, extra `vllm serve` flags, placement, start-up deadline).

Pure (pydantic only; api/base.py); api/models.py embeds it as spec.vllm.server.

extraArgs are an argv list appended to `vllm serve` (as TRL 1.16's `trl vllm-serve` appends its extra args): never a
shell string. Each flag must be in EXTRA_FLAGS (the `vllm serve` spelling of `trl vllm-serve`'s own options the
operator leaves to the user, and a few vLLM 0.31 engine flags; tests/unit/api check every one against vLLM 0.31's
parser and TRL's build_command); the flags the operator sets itself are refused with the field that sets them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator

from .base import IMAGE_PATTERN, INT32_MAX, MAX_MAP, MAX_TOLERATIONS, ResourceRequirements, _Model

DEFAULT_SERVER_GPU_MEMORY_UTILIZATION = 0.9  # trl vllm-serve's (and vllm serve's) default
DEFAULT_STARTUP_TIMEOUT_SECONDS = 1800  # a 70B model from a cold cache, with room

# `vllm serve` flags a user may add, and whether each takes a value. The first group is `trl vllm-serve`'s own
# ScriptArguments the operator does not set (TRL's defaults for dtype, kv-cache-dtype, model-impl and the log level
# are rendered first, so the user's later value wins, as with argparse); the second, vLLM 0.31 engine flags a
# server commonly needs.
TRL_SERVE_FLAGS: dict[str, bool] = {
    "--dtype": True, "--kv-cache-dtype": True, "--model-impl": True, "--uvicorn-log-level": True,
    "--enforce-eager": False, "--trust-remote-code": False, "--revision": True,
    "--distributed-executor-backend": True, "--speculative-config": True,
}
ENGINE_FLAGS: dict[str, bool] = {
    "--max-num-seqs": True, "--max-num-batched-tokens": True, "--quantization": True, "--seed": True,
    "--enable-chunked-prefill": False, "--no-enable-chunked-prefill": False, "--block-size": True,
    "--cpu-offload-gb": True, "--tokenizer": True, "--tokenizer-mode": True, "--load-format": True,
    "--enable-expert-parallel": False, "--compilation-config": True, "--hf-overrides": True,
    "--generation-config": True, "--disable-log-stats": False, "--no-enforce-eager": False,
}
EXTRA_FLAGS: dict[str, bool] = {**TRL_SERVE_FLAGS, **ENGINE_FLAGS}

# Flags the operator renders itself: a second copy would silently override (argparse keeps the last) what the
# operator, the trainer and TRL's client rely on.
OWNED_FLAGS: dict[str, str] = {
    "--host": "the operator binds 0.0.0.0",
    "--port": "set spec.vllm.server.port",
    "--tensor-parallel-size": "set spec.vllm.tensorParallelSize", "-tp": "set spec.vllm.tensorParallelSize",
    "--data-parallel-size": "set spec.vllm.server.dataParallelSize",
    "-dp": "set spec.vllm.server.dataParallelSize",
    "--gpu-memory-utilization": "set spec.vllm.server.gpuMemoryUtilization",
    "--max-model-len": "set spec.vllm.server.maxModelLen",
    "--enable-prefix-caching": "set spec.vllm.server.enablePrefixCaching",
    "--no-enable-prefix-caching": "set spec.vllm.server.enablePrefixCaching",
    "--model": "set spec.model",
    "--weight-transfer-config": "TRL's client needs the NCCL weight-transfer engine",
    "--logprobs-mode": "TRL needs processed_logprobs for its importance-sampling correction",
    "--max-logprobs": "TRL lifts the logprob cap itself (-1)",
    "--enable-scale-out": "TRL's client needs the scale-out endpoints",
    "--no-enable-scale-out": "TRL's client needs the scale-out endpoints",
}

_VALUE_RE = re.compile(r"^[^\x00-\x1f\x7f]*$")


def _flag_name(arg: str) -> str:
    """`--max_num_seqs=8` → `--max-num-seqs` (vLLM's parser accepts underscores and the = form)."""
    name = arg.split("=", 1)[0]
    return name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name


def extra_args_problems(args: list[str]) -> list[str]:
    """Why each flag of `args` is refused (empty: accepted). Pure, shared by the model validator and the tests."""
    problems: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not _VALUE_RE.match(arg):
            problems.append(f"extraArgs[{i - 1}] contains a control character")
            continue
        if not arg.startswith("-"):
            problems.append(f"{arg!r} is not a flag: each value must follow its flag (positional arguments are the "
                            "operator's: the model is spec.model)")
            continue
        name = _flag_name(arg)
        if name in OWNED_FLAGS or name not in EXTRA_FLAGS:
            problems.append(f"{name} is set by the operator: {OWNED_FLAGS[name]}" if name in OWNED_FLAGS else
                            f"{name} is not a `vllm serve` flag the operator passes on (accepted: "
                            f"{', '.join(sorted(EXTRA_FLAGS))})")
            if "=" not in arg and i < len(args) and not args[i].startswith("-"):
                i += 1  # its value: one reason per flag
            continue
        takes_value = EXTRA_FLAGS[name]
        if "=" in arg:
            if not takes_value:
                problems.append(f"{name} takes no value")
        elif takes_value:
            if i >= len(args) or args[i].startswith("--"):
                problems.append(f"{name} needs a value: add it as the next list item")
            else:
                i += 1
    return problems


class VllmServerSpec(_Model):
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Resources of the vLLM server pod; its GPUs are NOT part of the training world size. "
        "Default: tensorParallelSize GPUs of the trainers' GPU resource.",
    )
    port: Annotated[StrictInt, Field(ge=1024, le=65535)] = Field(default=8000, description="HTTP port of `vllm serve`.")
    image: Optional[Annotated[str, Field(max_length=512, pattern=IMAGE_PATTERN)]] = Field(
        default=None, description="Image of the vLLM server; defaults to the trainer image."
    )
    gpuMemoryUtilization: Annotated[float, Field(allow_inf_nan=False, gt=0, le=1)] = Field(
        default=DEFAULT_SERVER_GPU_MEMORY_UTILIZATION,
        description="Fraction of each server GPU vLLM may use (weights, activations, KV cache), in (0, 1]. The "
        "server's own value (trl vllm-serve's default 0.9); spec.vllm.gpuMemoryUtilization applies to colocate only. "
        "On a CPU server: the fraction of the pod's memory limit given to the KV cache.",
    )
    maxModelLen: Optional[Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]] = Field(
        default=None,
        description="vLLM's max_model_len (prompt + completion tokens). Default: the model's context size, which "
        "can be far larger than the KV cache holds; set it to at least maxPromptLength + maxCompletionLength.",
    )
    enablePrefixCaching: Optional[StrictBool] = Field(
        default=None,
        description="true: --enable-prefix-caching; false: --no-enable-prefix-caching; unset: vLLM's default.",
    )
    dataParallelSize: Optional[Annotated[StrictInt, Field(ge=1, le=64)]] = Field(
        default=None,
        description="vLLM data-parallel engines in the server pod (internal load balancing). Default: the server's "
        "GPUs ÷ tensorParallelSize; when set, tensorParallelSize × dataParallelSize must equal the server's GPUs "
        "(1 on a CPU server).",
    )
    extraArgs: Annotated[list[Annotated[StrictStr, Field(max_length=4096)]], Field(max_length=64)] = Field(
        default_factory=list,
        description="Extra `vllm serve` arguments, an argv list appended after the operator's (never a shell "
        "string), e.g. [--max-num-seqs, '256']. Only known flags are accepted; the ones the operator sets (port, "
        "parallelism, memory, context length, prefix caching, TRL's weight-transfer settings) are refused.",
    )
    nodeSelector: Optional[Annotated[dict[str, Annotated[str, Field(max_length=63)]], Field(max_length=MAX_MAP)]] = Field(
        default=None, description="The server pod's nodeSelector; default: spec.template.nodeSelector."
    )
    tolerations: Optional[Annotated[list[dict[str, Any]], Field(max_length=MAX_TOLERATIONS)]] = Field(
        default=None, description="The server pod's tolerations (Kubernetes Toleration objects); default: "
        "spec.template.tolerations."
    )
    startupTimeoutSeconds: Annotated[StrictInt, Field(ge=30, le=INT32_MAX)] = Field(
        default=DEFAULT_STARTUP_TIMEOUT_SECONDS,
        description="How long the server pods may take to become Ready (/health) before the attempt counts as a "
        "retryable server failure. Trainers are created only once every server pod is Ready.",
    )

    @field_validator("extraArgs")
    @classmethod
    def _known_flags(cls, v: list[str]) -> list[str]:
        problems = extra_args_problems(v)
        if problems:
            raise ValueError("; ".join(problems))
        return v
