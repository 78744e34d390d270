"""Platform defaults (pure): the operator's `jobDefaults` (a pod template of spec.template's shape) merged under a job's
own spec.template — the one merge the webhook, the operator and `grpojob check|render --defaults` use, before the
merged spec is validated and rendered (docs/pod-template.md, "Platform defaults").

Rules: the job's scalars win; maps merge key by key (recursively; the job's value wins); lists append, the default's
items first, dropping a default item the job also has (the same `name`, or an equal item); `affinity` is replaced
whole by the job's (merging node-selector terms would OR them, widening where the job may run).
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import ValidationError

from ..api import PodTemplate

REPLACED_WHOLE = frozenset({"affinity"})


def merge_template(defaults: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """`template` (a job's spec.template, as applied) over `defaults`: a new dict, neither argument changed."""
    out = dict(defaults)
    for key, value in template.items():
        out[key] = value if key in REPLACED_WHOLE or key not in defaults else _merge(defaults[key], value)
    return out


def _merge(default: Any, own: Any) -> Any:
    if isinstance(default, dict) and isinstance(own, dict):
        out = dict(default)
        for k, v in own.items():
            out[k] = _merge(default[k], v) if k in default else v
        return out
    if isinstance(default, list) and isinstance(own, list):
        return [d for d in default if not _shadowed(d, own)] + own
    return own


def _shadowed(item: Any, own: list[Any]) -> bool:
    """A default item the job's list replaces: an equal one, or one of the same name (env, volumes, pull secrets…)."""
    name = item.get("name") if isinstance(item, dict) else None
    return item in own or (name is not None and any(isinstance(o, dict) and o.get("name") == name for o in own))


def apply(defaults: Optional[dict[str, Any]], spec_doc: Any) -> Any:
    """The spec with spec.template merged over `defaults` (unchanged when there are none or the spec is no mapping:
    the validator reports that)."""
    if not defaults or not isinstance(spec_doc, dict):
        return spec_doc
    template = spec_doc.get("template")
    if template is None:
        template = {}
    if not isinstance(template, dict):
        return spec_doc
    return {**spec_doc, "template": merge_template(defaults, template)}


def check(defaults: Any, source: str) -> dict[str, Any]:
    """The defaults as read from `source` (a file name, for the message), validated as a spec.template; a
    ValueError naming the field and the source otherwise."""
    if defaults is None:
        return {}
    if not isinstance(defaults, dict):
        raise ValueError(f"{source}: job defaults must be a mapping of spec.template fields, got "
                         f"{type(defaults).__name__}")
    try:
        PodTemplate.model_validate(defaults)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{source}: {where}: {first['msg']} ({exc.error_count()} error(s) in the job defaults)") \
            from None
    return defaults


def parse(text: str, source: str) -> dict[str, Any]:
    """A job defaults file: a YAML mapping of spec.template fields (what the chart's ConfigMap holds), or a Helm
    values file whose `jobDefaults` key holds one; checked (a ValueError naming `source` otherwise)."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not YAML ({exc})".splitlines()[0]) from None
    if isinstance(doc, dict) and "jobDefaults" in doc:
        doc = doc["jobDefaults"]
    return check(doc, source)
