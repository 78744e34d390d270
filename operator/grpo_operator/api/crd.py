"""The GRPOJob CustomResourceDefinition, generated from the pydantic models in api/models.py."""

from __future__ import annotations

import copy
from typing import Any, Optional

import yaml

from . import cel
from . import models as api
from .status_models import GRPOJobStatus

MAX_DESCRIPTION = 300  # keeps the CRD well under kubectl apply's 256 KiB last-applied annotation

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Job phase"},
    {"name": "Nodes×GPUs", "type": "string", "jsonPath": ".status.topology", "description": "nodes × GPUs per node"},
    {"name": "Step", "type": "string", "jsonPath": ".status.progress.display", "description": "step/maxSteps"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.reward",
     "description": "mean reward at the last logging step"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1, "description": "gang restarts"},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model", "priority": 1, "description": "model"},
    # -o wide: what the phase means now, e.g. a spec.cache download's bytes and files done/total while Pending
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1,
     "description": "what the job is doing or waiting for"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _description(schema: dict[str, Any]) -> dict[str, Any]:
    text = schema.get("description")
    if not text:
        return {}
    text = " ".join(str(text).split())
    if len(text) > MAX_DESCRIPTION:
        text = text[: MAX_DESCRIPTION - 1] + "…"
    return {"description": text}


class _Converter:
    """pydantic JSON schema → a structural OpenAPI v3 schema (no anyOf/$ref, types everywhere)."""

    def __init__(self, defs: dict[str, Any]):
        self.defs = defs

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            target = self.defs[schema["$ref"].rsplit("/", 1)[-1]]
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return schema

    def _union(self, any_of: list[dict[str, Any]]) -> dict[str, Any]:
        """anyOf: one type (nullable when null is an option), int-or-string, or anything."""
        options = [self.resolve(s) for s in any_of]
        non_null = [s for s in options if s.get("type") != "null"]
        types = {s.get("type") for s in non_null}
        out: dict[str, Any]
        if len(non_null) == 1:
            out = self.convert(non_null[0])
        elif types == {"integer", "string"}:
            out = {"x-kubernetes-int-or-string": True}  # before 1.21: see for_kube_before_1_21()
        else:
            out = {"x-kubernetes-preserve-unknown-fields": True}
        if len(non_null) < len(options):
            out["nullable"] = True
        return out

    def convert(self, schema: dict[str, Any]) -> dict[str, Any]:
        schema = self.resolve(schema)
        desc = _description(schema)
        if "anyOf" in schema:
            return {**self._union(schema["anyOf"]), **desc}
        if "enum" in schema or "const" in schema:
            values = schema.get("enum", [schema.get("const")])
            enum_kind = "string" if all(isinstance(v, str) for v in values) else "integer"
            return {"type": enum_kind, "enum": values, **desc}
        kind = schema.get("type")
        if kind is None:
            return {"x-kubernetes-preserve-unknown-fields": True, **desc}
        if kind == "object":
            out: dict[str, Any] = {"type": "object"}
            props = schema.get("properties")
            if props:
                out["properties"] = {k: self.convert(v) for k, v in props.items()}
                if schema.get("required"):
                    out["required"] = sorted(schema["required"])
                if schema.get("additionalProperties") is not False:
                    out["x-kubernetes-preserve-unknown-fields"] = True
            else:
                extra = schema.get("additionalProperties", True)
                if extra is True or extra == {}:
                    out["x-kubernetes-preserve-unknown-fields"] = True
                else:
                    out["additionalProperties"] = self.convert(extra)
                    if out["additionalProperties"].get("type") == "string":
                        # kube-openapi (1.20) reads an empty string in a map as null: a label or nodeSelector value
                        # "" (valid) was refused at apply; the webhook still refuses a real null
                        out["additionalProperties"]["nullable"] = True
            if "maxProperties" in schema:  # the models' bounds on maps (labels, env-like maps, resources)
                out["maxProperties"] = schema["maxProperties"]
            return {**out, **desc}
        if kind == "array":
            items = schema.get("items", {})
            conv = self.convert(items)
            if "type" not in conv and "x-kubernetes-int-or-string" not in conv:
                conv = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            out = {"type": "array", "items": conv}
            for key in ("minItems", "maxItems"):
                if key in schema:
                    out[key] = schema[key]
            return {**out, **desc}
        out = {"type": kind}
        if kind == "integer":
            out["format"] = "int64"
        for src, dst in (("minimum", "minimum"), ("maximum", "maximum"), ("exclusiveMinimum", "minimum"),
                         ("exclusiveMaximum", "maximum"), ("minLength", "minLength"), ("maxLength", "maxLength"),
                         ("pattern", "pattern")):
            if src in schema:
                if src.endswith(("imum",)) and isinstance(schema[src], int) and abs(schema[src]) > 2**53:
                    # kube-apiserver reads bounds as float64: ±(2^63-1) rounds to 2^63 and overflows into
                    # "must be less than or equal to -9223372036854775808" for every value. format int64 bounds it.
                    continue
                out[dst] = schema[src]
                if src.startswith("exclusive"):
                    out["exclusive" + dst[:1].upper() + dst[1:]] = True
        return {**out, **desc}


def _schema_of(model: Any) -> dict[str, Any]:
    js = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
    conv = _Converter(js.get("$defs", {}))
    return conv.convert(js)


def openapi_schema() -> dict[str, Any]:
    spec = _schema_of(api.GRPOJobSpec)
    status = _schema_of(GRPOJobStatus)
    # Unknown spec keys are kept by the API server so that they reach the webhook (and the operator's own check),
    # which refuses them with "did you mean": pruned, a typo sent with --validate=false, by a client library or by
    # another controller would vanish and the job would run silently with TRL's default.
    _preserve_unknown_where_typed(spec)
    # The spec is one field for server-side apply: the API server's field manager does not walk into it. Before
    # Kubernetes 1.25 that walk doubles at each level of a value it has no schema for (an unknown key, a free-form
    # map): a value 20 levels deep took 3-5 s and 40 levels timed out after 34 s, per request (issue 27, finding 4).
    # Atomic, its cost is linear in the spec's size at any depth. The price: a server-side apply owns the whole spec,
    # so crd((1, 25)) and newer (the chart there) leave it per-field: those servers walk such values cheaply.
    spec["x-kubernetes-map-type"] = "atomic"
    status.setdefault("x-kubernetes-preserve-unknown-fields", True)
    return cel.apply({  # CEL rules and the bounds their cost needs: cel.py
        "type": "object",
        "description": "A GRPO post-training job: TRL's GRPOTrainer under torchrun on one or more nodes.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "grpo.dev/v1alpha1"},
            "kind": {"type": "string", "description": "GRPOJob"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    })


# What the API server keeps unread is bounded in width (a flood of 5,000 unknown keys is refused by the API server
# itself, before any webhook): a typed object keeps at most this many keys beyond its declared ones (typos), a
# free-form map (kwargs, affinity, volumes) at most this many in all.
MAX_UNKNOWN_PROPERTIES = 64


def _preserve_unknown_where_typed(schema: dict[str, Any]) -> None:
    """Every object with declared properties also keeps unknown keys for the validator to refuse by name; every
    object that keeps unknown keys has maxProperties."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        schema.setdefault("maxProperties", MAX_UNKNOWN_PROPERTIES)  # a map, or any value (bounds it when a map)
    if schema.get("type") == "object" and "properties" in schema:
        schema["x-kubernetes-preserve-unknown-fields"] = True
        schema.setdefault("maxProperties", len(schema["properties"]) + MAX_UNKNOWN_PROPERTIES)
        for sub in schema["properties"].values():
            _preserve_unknown_where_typed(sub)
    elif schema.get("type") == "array":
        _preserve_unknown_where_typed(schema["items"])
    elif isinstance(schema.get("additionalProperties"), dict):
        _preserve_unknown_where_typed(schema["additionalProperties"])


def for_kube_before_1_21(obj: Any) -> Any:
    """The CRD for Kubernetes 1.20 and older: every x-kubernetes-int-or-string becomes a value the API server keeps
    as is (the validator, the webhook, still refuses what is not an int or a string). Those servers cannot build
    their server-side-apply schema from a CRD with int-or-string ("error building openapi models … invalid property:
    anyOf", fixed in 1.21) and then walk every object without one, which doubles at each level of nesting: a value
    20 levels deep took 13 s, 40 levels timed out after 34 s, per request (issue 27, finding 4). Newer servers keep
    int-or-string: CEL (cel.py) cannot type the GPU counts without it."""
    if isinstance(obj, dict):
        out = {k: for_kube_before_1_21(v) for k, v in obj.items() if k != "x-kubernetes-int-or-string"}
        if obj.get("x-kubernetes-int-or-string"):
            out["x-kubernetes-preserve-unknown-fields"] = True
        return out
    if isinstance(obj, list):
        return [for_kube_before_1_21(v) for v in obj]
    return obj


ATOMIC_BEFORE = (1, 25)  # from 1.25 the field manager's walk of schema-less values is cheap: the spec stays per-field


def crd(kube: Optional[tuple[int, int]] = None) -> dict[str, Any]:
    """The CRD for a server of version `kube` (major, minor); None: the one file (crds/) for every server from 1.21.
    Before 1.21 without int-or-string (for_kube_before_1_21); from 1.25 the spec is not atomic, so that a
    server-side apply (Flux, Argo CD) owns only the fields it sets, as for any object."""
    if kube is not None and kube < (1, 21):
        old: dict[str, Any] = for_kube_before_1_21(crd())
        return old
    if kube is not None and kube >= ATOMIC_BEFORE:
        out = crd()
        out["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].pop("x-kubernetes-map-type")
        return out
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "grpo-operator", "app.kubernetes.io/part-of": "grpo-operator"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["all", "grpo"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def crd_yaml(kube: Optional[tuple[int, int]] = None) -> str:
    header = "# Generated by `grpojob crd` from operator/grpo_operator/api/models.py. Do not edit by hand.\n"
    return header + yaml.safe_dump(crd(kube), sort_keys=False, allow_unicode=True, width=120)


def parse_kube_version(text: str) -> tuple[int, int]:
    """"1.20", "v1.29.3", "1.28+" (GKE, EKS) → (1, 20); ValueError naming the expected form otherwise."""
    parts = text.strip().lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1].rstrip("+").split("-")[0])
    except (ValueError, IndexError):
        raise ValueError(f"--kube-version \"{text}\" is not a Kubernetes version: write MAJOR.MINOR, e.g. 1.29") from None
