"""The validating admission webhook: the very validator behind `grpojob check`, plus update rules.

`review()` is the decision (pure); `register()` wires it into a kopf registry as `kopf.on.validate` for
CREATE and UPDATE of grpojobs (failurePolicy Fail), and `server()` builds the HTTPS endpoint.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from . import api, certs, validation

log = logging.getLogger("grpo_operator.webhook")

# Spec fields a running job cannot change: its pods were rendered from them (topology, batch, model, data…).
MUTABLE_FIELDS = {"runPolicy"}
# Pod placement may change while the job is suspended (no pods exist): what Kueue does on admission.
MUTABLE_WHILE_SUSPENDED = {"template"}
WEBHOOK_CONFIG_NAME = "grpo-operator.grpo.dev"


@dataclass
class Review:
    allowed: bool
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    code: int = 422
    reason: str = ""  # a denial's first offending field (e.g. spec.training.numGenerations): the metrics label


def reason_label(path: str) -> str:
    """A denial's field as a bounded metrics label: list indices dropped (spec.rewards[2].name → spec.rewards.name),
    and a name the user made up (an unknown field or training argument) becomes `(unknown)`."""
    import re

    from . import trl_fields

    parts = [p for p in re.sub(r"\[\d+\]", "", path or "").split(".") if p]
    if not parts:
        return "(object)"
    if parts[0] != "spec":
        return ".".join(parts[:2]) if parts[0] == "metadata" and parts[1:2] in (["name"], ["namespace"], ["labels"]) \
            else parts[0] if parts[0] in ("metadata", "apiVersion", "kind") else "(unknown)"
    out, model = ["spec"], api.GRPOJobSpec
    for p in parts[1:]:
        if model is api.TrainingSpec:
            out.append(p if p in trl_fields.by_camel() else "(unknown)")
            break
        fields = getattr(model, "model_fields", None)
        if not fields:
            break
        if p not in fields:
            out.append("(unknown)")
            break
        out.append(p)
        ann = fields[p].annotation
        model = next((a for a in _models_in(ann)), None)
    return ".".join(out)


def _models_in(annotation: Any) -> Any:
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for a in typing.get_args(annotation):
        yield from _models_in(a)


def _format_errors(name: str, res: validation.ValidationResult) -> str:
    lines = [f"GRPOJob {name!r} is invalid ({len(res.errors)} error{'s' if len(res.errors) != 1 else ''}):"]
    for e in res.errors:
        lines.append(f"  * {e.field or '(object)'}: {e.message}")
    return "\n".join(lines)


def review(operation: str, new: Optional[Mapping[str, Any]], old: Optional[Mapping[str, Any]] = None) -> Review:
    """Admit or deny a GRPOJob CREATE/UPDATE (dicts as in the AdmissionReview)."""
    if operation not in ("CREATE", "UPDATE") or new is None:
        return Review(True)
    doc = {k: new.get(k) for k in ("apiVersion", "kind", "metadata", "spec") if k in new}
    name = (new.get("metadata") or {}).get("name") or (new.get("metadata") or {}).get("generateName") or "?"
    if isinstance(doc.get("metadata"), dict) and not doc["metadata"].get("name") and doc["metadata"].get("generateName"):
        doc["metadata"] = {**doc["metadata"], "name": doc["metadata"]["generateName"].rstrip("-.") or "job"}
    res = validation.validate(doc)
    if not res.valid:
        return Review(False, _format_errors(str(name), res), list(res.warnings),
                      reason=reason_label(res.errors[0].field if res.errors else ""))
    warnings = [f"spec: {w}" if not w.startswith("spec") else w for w in res.warnings]
    if operation == "UPDATE" and old is not None:
        old_doc = {k: old.get(k) for k in ("apiVersion", "kind", "metadata", "spec") if k in old}
        old_valid = validation.validate(old_doc).valid
        if old_valid:  # a Rejected (invalid) job may be fixed freely: it never had pods
            old_spec = old.get("spec") or {}
            new_spec = new.get("spec") or {}
            suspended = bool((old_spec.get("runPolicy") or {}).get("suspend")) and bool(
                (new_spec.get("runPolicy") or {}).get("suspend"))
            changed = sorted(k for k in set(old_spec) | set(new_spec)
                             if old_spec.get(k) != new_spec.get(k) and k not in MUTABLE_FIELDS
                             and not (suspended and k in MUTABLE_WHILE_SUSPENDED))
            if changed:
                fields = ", ".join(f"spec.{k}" for k in changed)
                hint = " (spec.template may change only while the job is suspended)" if "template" in changed else ""
                return Review(False,
                              f"GRPOJob {name!r}: {fields} cannot change on an existing job: its pods, topology and batch "
                              f"were set up from them{hint}. Only spec.runPolicy (suspend, backoffLimit, "
                              f"activeDeadlineSeconds, ttlSecondsAfterFinished) and metadata may change. "
                              f"To change the others, delete the job and create a new one (it resumes from the "
                              f"checkpoints in spec.output).", warnings, reason=f"spec.{changed[0]}")
    return Review(True, "", warnings)


def register(registry: Any) -> None:
    import kopf

    @kopf.on.validate(api.GROUP, api.VERSION, api.PLURAL, id="validate", operations=["CREATE", "UPDATE"],
                      registry=registry)
    async def validate_grpojob(body: Any, old: Any, new: Any, operation: Optional[str], warnings: list[str], **_: Any) -> None:
        new_d = dict(new) if new is not None else (dict(body) if body is not None else None)
        old_d = dict(old) if old is not None else None
        r = review(operation or "", new_d, old_d)
        from . import metrics as opmetrics  # metrics are updated here, in the I/O layer, never in review()

        opmetrics.WEBHOOK_REQUESTS.labels(operation=operation or "", allowed="true" if r.allowed else "false").inc()
        if not r.allowed:
            opmetrics.WEBHOOK_DENIALS.labels(reason=r.reason or "unknown").inc()
        warnings.extend(r.warnings)
        if not r.allowed:
            raise kopf.AdmissionError(r.message, code=r.code)


def parse_service(ref: str) -> tuple[str, str, int]:
    """'NAMESPACE/NAME[:PORT]' → (namespace, name, port); port defaults to 443."""
    ns, sep, rest = ref.partition("/")
    name, _, port = rest.partition(":")
    if not sep or not ns or not name:
        raise ValueError(f"webhook service must be NAMESPACE/NAME[:PORT], got {ref!r}")
    return ns, name, int(port or 443)


def _service_server_class() -> Any:
    import kopf

    class ServiceWebhookServer(kopf.WebhookServer):
        """Registers the webhook by Service reference instead of URL.

        In a cluster the API server often cannot resolve `<svc>.<ns>.svc` (it runs outside the cluster DNS), but it
        always reaches a Service reference through its own service proxy.
        """

        def __init__(self, *args: Any, service: tuple[str, str, int], **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.service = service

        async def __call__(self, fn: Any) -> Any:
            ns, name, port = self.service
            async for client_config in super().__call__(fn):
                config = {k: v for k, v in client_config.items() if k != "url"}
                config["service"] = {"namespace": ns, "name": name, "port": port, "path": self.path or "/"}
                yield config

    return ServiceWebhookServer


def server(listen: str, host: Optional[str], cert_dir: Optional[str], service: Optional[str] = None) -> Any:
    """A kopf.WebhookServer on ADDR:PORT with our certificates (generated unless `cert_dir`).

    With `service` ('NAMESPACE/NAME[:PORT]') the managed configuration points at that Service instead of a URL.
    """
    import kopf

    from . import metrics

    addr, port = metrics.parse_listen(listen)
    dial_host = host or (addr if addr not in ("0.0.0.0", "::") else "127.0.0.1")
    svc = parse_service(service) if service else None
    names = [dial_host] + ([addr] if addr not in ("0.0.0.0", "::") else [])
    if svc:
        ns, name, _ = svc
        names += [f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
    if cert_dir:
        files = certs.from_dir(cert_dir)
    else:
        tmp = tempfile.mkdtemp(prefix="grpo-webhook-certs-")
        files = certs.generate(tmp, list(dict.fromkeys(names)))
        log.info("generated a webhook CA and serving certificate for %s in %s", ", ".join(dict.fromkeys(names)), tmp)
    kwargs = dict(addr=addr, port=port, host=dial_host, certfile=str(files.certfile),
                  pkeyfile=str(files.keyfile), cafile=str(files.cafile) if files.cafile else None)
    if svc:
        return _service_server_class()(service=svc, **kwargs)
    return kopf.WebhookServer(**kwargs)
