"""TRL 1.16 GRPOConfig's fields, read from the generated table (the operator never imports TRL)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class TrlField:
    name: str  # TRL's snake_case name
    camel: str  # the name users write in spec.training
    kind: str  # bool | int | float | str | list[str] | list[float] | dict | any | int-or-string | opaque
    nullable: bool
    choices: tuple[str, ...] | None
    default: Any
    help: str


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    text = resources.files("grpo_operator.api").joinpath("data/grpo_config_fields.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@lru_cache(maxsize=1)
def fields() -> tuple[TrlField, ...]:
    return tuple(
        TrlField(
            name=f["name"],
            camel=f["camel"],
            kind=f["kind"],
            nullable=f["nullable"],
            choices=tuple(f["choices"]) if f["choices"] else None,
            default=f["default"],
            help=f["help"],
        )
        for f in table()["fields"]
    )


@lru_cache(maxsize=1)
def by_camel() -> dict[str, TrlField]:
    return {f.camel: f for f in fields()}


def trl_version() -> str:
    return str(table()["trl"])


@lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields()}


def default(name: str) -> Any:
    """TRL's default for a snake_case field name (KeyError for an unknown one)."""
    return _defaults()[name]


# Fields the operator sets from other parts of the spec: a user value there would be silently overridden or
# would leak a secret into a ConfigMap, so it is refused with a pointer to the right place.
OWNED_BY_SPEC: dict[str, str] = {
    "outputDir": "set spec.output.path (checkpoints go to <path>/<job name>)",
    "useVllm": "set spec.vllm.mode (colocate | server | none)",
    "vllmMode": "set spec.vllm.mode (colocate | server | none)",
    "vllmTensorParallelSize": "set spec.vllm.tensorParallelSize",
    "vllmGpuMemoryUtilization": "set spec.vllm.gpuMemoryUtilization",
    "vllmServerHost": "the operator points the trainer at its own vLLM server Service (spec.vllm.mode: server)",
    "vllmServerPort": "the operator points the trainer at its own vLLM server Service (spec.vllm.mode: server)",
    "vllmServerBaseUrl": "the operator points the trainer at its own vLLM server Service (spec.vllm.mode: server)",
    "rewardWeights": "set spec.rewards[].weight",
    "hubToken": "never put a token in a spec: set spec.hfTokenSecretRef to a Secret (it reaches the pods as HF_TOKEN)",
    "parallelismConfig": "not supported by GRPOTrainer through a manifest",
}


@dataclass(frozen=True)
class Removed:
    version: str  # the TRL release whose GRPOConfig no longer has the argument
    instead: str  # what to do now


# GRPOConfig arguments TRL removed, with the release that removed them and the replacement its deprecation notice
# named. Read from TRL's history (each name present in GRPOConfig at one release tag and gone at the next; the
# deprecation text in the release before); none was removed between 0.28.0 and the 1.16.0 the table is generated from.
REMOVED: dict[str, Removed] = {
    "maxPromptLength": Removed("0.28.0", "TRL no longer truncates prompts: filter or shorten the prompts in your dataset "
                                         "(the vLLM server's context is spec.vllm.server.maxModelLen)"),
    "useLigerLoss": Removed("0.28.0", "use useLigerKernel"),
    "vllmGuidedDecodingRegex": Removed("0.28.0", "use vllmStructuredOutputsRegex"),
    "wandbLogUniquePrompts": Removed("0.27.0", "use logUniquePrompts"),
    "vllmDevice": Removed("0.18.0", "set spec.vllm.mode: server (the operator runs the vLLM server pod)"),
    "vllmDtype": Removed("0.18.0", "the vLLM server picks the model's dtype"),
    "vllmMaxModelLen": Removed("0.18.0", "set spec.vllm.server.maxModelLen"),
    "vllmEnablePrefixCaching": Removed("0.18.0", "set spec.vllm.server.enablePrefixCaching"),
}


def removed(name: str) -> str | None:
    """Why a GRPOConfig argument that TRL removed is refused (camelCase or snake_case name), or None."""
    camel = name if "_" not in name else name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:])
    r = REMOVED.get(camel)
    if r is None:
        return None
    return f"'{name}' was removed from GRPOConfig in TRL {r.version} (the operator runs TRL {trl_version()}): {r.instead}"


def suggest(name: str) -> str | None:
    """The closest real camelCase field name (also accepts snake_case input)."""
    cands = list(by_camel())
    snake = {f.name: f.camel for f in fields()}
    if name in snake:
        return snake[name]
    match = difflib.get_close_matches(name, cands, n=1, cutoff=0.6)
    if not match:
        lowered = {c.lower(): c for c in cands}
        match = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
        match = [lowered[m] for m in match]
    return match[0] if match else None
