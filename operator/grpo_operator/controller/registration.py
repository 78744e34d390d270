"""kopf's side of the operator: build() (a kopf registry with the handlers, kopf's settings and the controller), the
login, the start of the GRPOJob watch that feeds the controller, and kopf's settings.

GRPOJobs are followed by our own list + watch (jobwatch.py), started by kopf's startup handler; only with
`--peering` (kopf's HA, which pauses kopf's own watches) does kopf watch them. Either way each event goes to
handlers.Controller.job_event, which caches the job and kicks its reconciler; kopf keeps no state in the objects
(no annotations, no finalizers, no diff base).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from .. import api
from . import kube, webhookconfig
from . import metrics as opmetrics
from .handlers import Controller
from .settings import Settings

log = logging.getLogger("grpo_operator")


async def _login(**kwargs: Any) -> Any:
    info = None
    try:
        info = kopf.login_with_service_account(**kwargs)
    except Exception:
        info = None
    if info is None:
        info = kopf.login_with_kubeconfig(**kwargs)
    return info


def register(registry: kopf.OperatorRegistry, controller: Controller) -> None:
    """Register the controller's handlers (and the login) on a fresh registry."""
    cfg = controller.config

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> Any:
        info = await _login(**kwargs)
        if info is not None:
            writer = controller.writer
            if writer.kube is not None:
                await writer.kube.close()
            # a 401 later (a rotated token) logs in again with kopf's own arguments (it requires settings=)
            writer.kube = kube.Kube(info, relogin=lambda: _login(**kwargs), limit=cfg.max_concurrent_writes)
        return info

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await controller.close()

    if not cfg.controller:
        return
    if cfg.peering is None:
        @kopf.on.startup(registry=registry)
        async def follow_jobs(**_: Any) -> None:
            controller.job_watch.start()  # our own list + watch of GRPOJobs (jobwatch.py), on standbys too
        return

    # --peering pauses only kopf's own watches: there kopf's watch of GRPOJobs feeds the same entry point
    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry)
    async def job_event(event: Any, body: Any, **_: Any) -> None:
        controller.job_event(event.get("type") or "MODIFIED", dict(body))


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf deep-copies every object on every event it watches (with --peering: the jobs) to diff it for
    on.create/on.update handlers. We register none, so the diff is never read: skipping it saves CPU (measured:
    docs/performance.md, "operator"). Nothing is stored on the objects either."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> Any:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


def build(cfg: Settings) -> tuple[kopf.OperatorRegistry, kopf.OperatorSettings, Controller]:
    """The operator: a kopf registry with the controller's handlers (and the webhook's), kopf's settings, and the
    controller."""
    registry = kopf.OperatorRegistry()
    controller = Controller(cfg)
    opmetrics.track_jobs(lambda: list(controller.observers.jobs.values()))
    register(registry, controller)
    settings = settings_for(cfg)
    if cfg.webhook_listen:
        from ..webhook import server as webhook

        webhook.serve_directly(settings.admission.server, webhook.register(registry, opmetrics.count_review, cfg.limits))
        if cfg.webhook_manage:  # our own writer of the configuration, not kopf's managed mode (webhookconfig.py)
            settings.admission.server = webhookconfig.publishing(settings.admission.server,
                                                                 lambda: controller.writer.kube, cfg)
    return registry, settings, controller


def settings_for(cfg: Settings) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.scanning.disabled = not cfg.scanning
    settings.posting.level = logging.WARNING
    # With --peering (kopf watches the jobs): kopf keeps a worker (task, queue, latest body) per object for
    # idle_timeout after its last event (default 5 s): in a burst of 1000 jobs that is thousands of live workers, a
    # peak the process never gives back. Our event handler only kicks the reconciler: a worker has nothing to wait for.
    settings.queueing.idle_timeout = 0.5
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    settings.persistence.finalizer = "grpo.dev/finalizer"  # only used if a handler ever needs one (none does)
    if cfg.webhook_listen:
        from ..webhook import server as webhook

        addr, port = opmetrics.parse_listen(cfg.webhook_listen)
        settings.admission.server = webhook.server(addr, port, cfg.webhook_host, cfg.webhook_cert_dir,
                                                   cfg.webhook_service)
        # --webhook-manage: our own writer of the configuration (webhookconfig.py, set up in build), not
        # kopf's managed mode, which needs create on every webhook configuration and removes it on shutdown
    return settings
