"""The operator's own ValidatingWebhookConfiguration (`--webhook-manage`), written by us instead of kopf's managed mode.

Why not kopf's: at start it *creates* both a validating and a mutating configuration (RBAC cannot limit `create` by
name, so a stolen token could register a mutating webhook: cluster-admin in effect), and on a graceful shutdown it
empties the webhooks (validation off during a Recreate upgrade). Here:
  * the configuration is only ever PATCHed by name (the chart owns the object: RBAC `patch` with `resourceNames`); it
    is created only when `create` is allowed (`grpo-operator` run by hand against a cluster, GRPO_WEBHOOK_CREATE=1,
    the default) and it is missing; there is no mutating configuration at all;
  * nothing is removed on shutdown: a stopped operator's webhook refuses (failurePolicy Fail) until a replica serves
    again, exactly as the chart-managed (cert-manager) configuration does;
  * watching a subset of namespaces, the webhook carries a namespaceSelector on `kubernetes.io/metadata.name`, so one
    team's operator outage never blocks another namespace. That label is set on every namespace from Kubernetes 1.21
    on; on an older API server the selector would match nothing set by hand, so it is left out (with a warning).
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Optional
from urllib.parse import quote

from .. import api
from . import kube as kube_mod
from .settings import Settings

log = logging.getLogger("grpo_operator.webhook")

VWC_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace since 1.21


def with_handler_path(client_config: dict[str, Any], handler_id: str) -> dict[str, Any]:
    """kopf serves each handler at <root>/<id> (as kopf's own manager writes it)."""
    config = copy.deepcopy(client_config)
    if config.get("url") is not None:
        config["url"] = f"{config['url'].rstrip('/')}/{quote(handler_id)}"
    if config.get("service") is not None:
        config["service"]["path"] = f"{config['service'].get('path', '')}/{quote(handler_id)}"
    return config


def server_minor(version: dict[str, Any]) -> Optional[tuple[int, int]]:
    """(major, minor) of a /version answer ('1', '21+' on some distributions); None if unreadable."""
    try:
        return int(version.get("major", "")), int(re.sub(r"\D.*$", "", str(version.get("minor", ""))))
    except ValueError:
        return None


def namespace_selector(namespaces: list[str], version: Optional[tuple[int, int]]) -> Optional[dict[str, Any]]:
    if not namespaces:
        return None  # cluster-wide
    if version is None or version < (1, 21):
        return None
    return {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "In", "values": sorted(namespaces)}]}


def webhooks(config_name: str, handler_id: str, client_config: dict[str, Any],
             selector: Optional[dict[str, Any]], failure_policy: str = "Fail") -> list[dict[str, Any]]:
    hook: dict[str, Any] = {
        "name": f"{handler_id}.{config_name}",
        "sideEffects": "None",
        "failurePolicy": failure_policy,  # the chart's webhook.failurePolicy (GRPO_WEBHOOK_FAILURE_POLICY)
        "matchPolicy": "Equivalent",
        "rules": [{"apiGroups": [api.GROUP], "apiVersions": [api.VERSION], "resources": [api.PLURAL],
                   "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}],
        "clientConfig": with_handler_path(client_config, handler_id),
        "timeoutSeconds": 30,
        "admissionReviewVersions": ["v1", "v1beta1"],
    }
    if selector is not None:
        hook["namespaceSelector"] = selector
    return [hook]


class Publisher:
    """Writes the webhook configuration for every client config the webhook server yields."""

    def __init__(self, kube: Callable[[], Optional[kube_mod.Kube]], config_name: str, handler_id: str,
                 namespaces: list[str], create: bool, failure_policy: str = "Fail"):
        self.kube, self.config_name, self.handler_id = kube, config_name, handler_id
        self.namespaces, self.create, self.failure_policy = namespaces, create, failure_policy
        self.version: Optional[tuple[int, int]] = None

    async def publish(self, client_config: dict[str, Any]) -> None:
        k = self.kube()
        if k is None:
            raise RuntimeError("not logged in yet")
        if self.namespaces and self.version is None:
            self.version = server_minor(await k.request("GET", "/version"))
            if self.version is None or self.version < (1, 21):
                log.warning("API server %s: namespaces carry no %s label before 1.21, so the webhook gets no "
                            "namespaceSelector (it is called for GRPOJobs of every namespace)", self.version,
                            NAMESPACE_LABEL)
        hooks = webhooks(self.config_name, self.handler_id, client_config,
                         namespace_selector(self.namespaces, self.version), self.failure_policy)
        path = f"{VWC_PATH}/{quote(self.config_name)}"
        # not fenced: every replica serves the webhook, a standby included (leader election gates the controller only)
        try:
            await k.request("PATCH", path, body={"webhooks": hooks}, content_type=kube_mod.MERGE_PATCH, fenced=False)
        except kube_mod.NotFound:
            if not self.create:
                raise RuntimeError(f"ValidatingWebhookConfiguration {self.config_name} does not exist (the chart "
                                   "creates it; the operator only patches it)") from None
            body = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": self.config_name}, "webhooks": hooks}
            await k.request("POST", VWC_PATH, body=body, fenced=False)
        log.info("webhook configuration %s published", self.config_name)


class PublishingServer:
    """Wraps a kopf webhook server (an async generator of client configs): publishes each config, then passes it on
    to kopf (whose managed mode stays off)."""

    def __init__(self, inner: Any, publish: Callable[[dict[str, Any]], Awaitable[None]]):
        self.inner, self.publish = inner, publish

    # kopf enters a server that is an async context manager (kopf.WebhookServer cleans up its files on exit)
    async def __aenter__(self) -> PublishingServer:
        entered = await self.inner.__aenter__() if hasattr(self.inner, "__aenter__") else self.inner
        return PublishingServer(entered, self.publish)

    async def __aexit__(self, *exc: Any) -> Any:
        return await self.inner.__aexit__(*exc) if hasattr(self.inner, "__aexit__") else None

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        import asyncio

        async for client_config in self.inner(fn):
            while True:  # the API server or our login may not be ready yet: the server itself is already serving
                try:
                    await self.publish(dict(client_config))
                    break
                except Exception as exc:
                    log.warning("webhook configuration not published yet: %s; retrying", exc)
                    await asyncio.sleep(2)
            yield client_config


def publishing(server: Any, kube: Callable[[], Optional[kube_mod.Kube]], cfg: Settings) -> PublishingServer:
    from ..webhook.server import HANDLER_ID

    publisher = Publisher(kube, cfg.webhook_config_name, HANDLER_ID, [] if cfg.all_namespaces else cfg.namespaces,
                          cfg.webhook_create, cfg.webhook_failure_policy)
    return PublishingServer(server, publisher.publish)
