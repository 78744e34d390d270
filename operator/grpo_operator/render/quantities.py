"""Kubernetes quantities: parse, sum and format them the way the scheduler counts a pod's requests (pure; the
gang objects' minResources, the vLLM server's and the trainers' sizing).

May import the standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(10) ** 3,
            "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
            "E": Decimal(10) ** 18}
_QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


def parse_quantity(value: Any) -> tuple[Decimal, str]:
    """A Kubernetes quantity → (value in base units, 'binary' | 'decimal' | 'plain'): the format a sum keeps."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Decimal(value), "plain"
    m = _QUANTITY_RE.match(str(value).strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as e:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from e
    suffix = m.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix], "binary"
    if suffix[:1] in ("e", "E"):
        return number * (Decimal(10) ** int(suffix[1:])), "decimal"
    return number * _DECIMAL[suffix], ("decimal" if suffix not in ("", "m", "u", "n") else "plain")


def format_quantity(value: Decimal, style: str = "plain") -> str:
    """Base units → a canonical quantity string: whole numbers with the largest exact suffix of `style`,
    fractions in milli-units (rounded up: a minimum must never shrink)."""
    if value != value.to_integral_value():
        milli = (value * 1000).to_integral_value(rounding="ROUND_CEILING")
        return f"{milli}m"
    whole = int(value)
    if style == "binary":
        for suffix, factor in reversed(_BINARY.items()):
            if whole and whole % factor == 0:
                return f"{whole // factor}{suffix}"
    elif style == "decimal":
        for suffix in ("E", "P", "T", "G", "M", "k"):
            factor = int(_DECIMAL[suffix])
            if whole and whole % factor == 0:
                return f"{whole // factor}{suffix}"
    return str(whole)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, tuple[Decimal, str]]:
    """A pod's effective request, as the scheduler (and Kueue, and Kubeflow's PodGroups) count it: the sum over
    containers (a request defaults to its limit), at least the largest init container, plus the pod overhead."""
    spec = pod.get("spec") or {}

    def container_requests(c: Mapping[str, Any]) -> dict[str, tuple[Decimal, str]]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: parse_quantity(v) for k, v in merged.items()}

    total: dict[str, tuple[Decimal, str]] = {}
    for c in spec.get("containers") or []:
        for k, (v, style) in container_requests(c).items():
            old = total.get(k, (Decimal(0), style))
            total[k] = (old[0] + v, _merge_style(old[1], style))
    for c in spec.get("initContainers") or []:
        for k, (v, style) in container_requests(c).items():
            if v > total.get(k, (Decimal(0), style))[0]:
                total[k] = (v, style)
    for k, raw in (spec.get("overhead") or {}).items():
        v, style = parse_quantity(raw)
        old = total.get(k, (Decimal(0), style))
        total[k] = (old[0] + v, _merge_style(old[1], style))
    return total


def _merge_style(a: str, b: str) -> str:
    return a if a == b else ("binary" if "binary" in (a, b) else "decimal" if "decimal" in (a, b) else "plain")


def sum_requests(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Σ effective requests of `pods`, as a ResourceList of canonical quantity strings (sorted by name)."""
    total: dict[str, tuple[Decimal, str]] = {}
    for pod in pods:
        for k, (v, style) in pod_requests(pod).items():
            old = total.get(k, (Decimal(0), style))
            total[k] = (old[0] + v, _merge_style(old[1], style))
    return {k: format_quantity(v, style) for k, (v, style) in sorted(total.items()) if v > 0}
