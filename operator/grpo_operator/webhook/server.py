"""The webhook's I/O: `register()` wires review() into a kopf registry as `kopf.on.validate` for CREATE and UPDATE
of grpojobs (failurePolicy Fail); `server()` builds the HTTPS endpoint with our certificates, served on an event loop
and thread of its own (never the controller's), reviews validated on worker threads, load shed with a fast 429.

May import review, certs, api and kopf; nothing from controller or cli (metrics reach it as a callback).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from .. import api
from ..rules.limits import NO_LIMITS, Limits
from . import certs
from .loopthread import LoopThread
from .review import Review, review

log = logging.getLogger("grpo_operator.webhook")


HANDLER_ID = "validate"  # kopf serves the handler at <root path>/<id>


class RefusalIsNotAnError(logging.Filter):
    """kopf logs a handler's AdmissionError as "Webhook 'validate' failed permanently: …" at ERROR. A refused spec is
    the webhook doing its job, not an operator error (alerts on error logs would fire for every user typo): INFO."""

    PREFIX = f"Webhook '{HANDLER_ID}' failed permanently:"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith(self.PREFIX):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_REFUSAL_FILTER = RefusalIsNotAnError()


REVIEW_THREADS = 2  # reviews validated at once; the rest wait their turn
MAX_HELD_REVIEWS = 256  # reviews waiting or validating; past it a review is answered 429 at once
QUEUE_BUDGET = 5.0  # seconds a review may wait for a worker; one that waited longer is answered 429 unvalidated
BUSY_CODE = 429


class ReviewPool:
    """Runs review() on a few worker threads, never on the event loop that serves the webhook: a review is CPU work a
    tenant chooses (its cost is bounded by the validator, its latency here). Only that loop's thread uses a pool.

    Load is shed with a fast 429 rather than queued without end: past MAX_HELD_REVIEWS held, or once a review waited
    QUEUE_BUDGET for a worker (a review the API server may already have given up on is not worth validating: under a
    flood that work is what makes every later review late too). The API server returns the 429 to the client as the
    refusal of its write ("retry"); no write is ever admitted unvalidated."""

    def __init__(self, threads: int = REVIEW_THREADS, max_held: int = MAX_HELD_REVIEWS,
                 queue_budget: float = QUEUE_BUDGET, clock: Callable[[], float] = time.monotonic):
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpo-review")
        self.max_held, self.queue_budget, self.clock = max_held, queue_budget, clock
        self.held = 0

    def busy(self, why: str) -> Review:
        return Review(False, f"the GRPOJob admission webhook is busy ({why}); retry the request", code=BUSY_CODE,
                      reason="(busy)")

    def _review_if_in_time(self, queued_at: float, operation: str, new: Optional[dict[str, Any]],
                           old: Optional[dict[str, Any]], limits: Limits) -> Review:
        waited = self.clock() - queued_at
        if waited > self.queue_budget:
            return self.busy(f"this review waited {waited:.1f} s for a worker")
        return review(operation, new, old, limits)

    async def review(self, operation: str, new: Optional[dict[str, Any]], old: Optional[dict[str, Any]],
                     limits: Limits) -> Review:
        if self.held >= self.max_held:  # only the loop's thread changes `held`: no lock
            return self.busy(f"{self.held} reviews in progress")
        self.held += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, self._review_if_in_time, self.clock(), operation, new,
                                              old, limits)
        finally:
            self.held -= 1


Serve = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]  # an AdmissionReview → the AdmissionReview answering it


def register(registry: Any, on_review: Optional[Callable[[str, Review], None]] = None,
             limits: Limits = NO_LIMITS) -> Serve:
    """`on_review(operation, review)` is called for every review (the controller counts them in its metrics);
    `limits`: the operator's policy (GRPO_MAX_NODES_PER_JOB), the same the controller applies.

    Returns the same review as a function of the AdmissionReview, for `serve_directly()`: kopf's admission path
    deep-copies every reviewed object before it finds there is nothing to patch (~0.2 s of CPU for the costliest
    spec the CRD admits, 8× the review itself); the kopf handler stays for kopf's view of the webhook."""
    import kopf

    # kopf's per-object logger (a LoggerAdapter over "kopf.objects"): filters on a logger see its own records
    logging.getLogger("kopf.objects").addFilter(_REFUSAL_FILTER)

    pool = ReviewPool()

    async def admit(operation: str, new: Optional[dict[str, Any]], old: Optional[dict[str, Any]]) -> Review:
        r = await pool.review(operation, new, old, limits)
        if on_review is not None:
            on_review(operation, r)
        return r

    @kopf.on.validate(api.GROUP, api.VERSION, api.PLURAL, id=HANDLER_ID, operations=["CREATE", "UPDATE"],
                      registry=registry)
    async def validate_grpojob(*, body: Any, warnings: list[str], old: Any = None, new: Any = None,
                               operation: Optional[str] = None, **_: Any) -> None:
        new_d = dict(new) if new is not None else (dict(body) if body is not None else None)
        old_d = dict(old) if old is not None else None
        r = await admit(operation or "", new_d, old_d)
        warnings.extend(r.warnings)
        if not r.allowed:
            raise kopf.AdmissionError(r.message, code=r.code)

    async def serve(review_request: dict[str, Any]) -> dict[str, Any]:
        req = review_request.get("request") or {}
        operation, new, old = req.get("operation") or "", req.get("object"), req.get("oldObject")
        r = await admit(operation, new, old) if operation in ("CREATE", "UPDATE") else Review(True)
        response: dict[str, Any] = {"uid": req.get("uid", ""), "allowed": r.allowed}
        if r.warnings:
            response["warnings"] = list(r.warnings)
        if not r.allowed:
            response["status"] = {"message": r.message, "code": r.code}
            log.info("%s %s/%s refused: %s", operation, req.get("namespace", ""), req.get("name", ""),
                     r.message.splitlines()[0] if r.message else "")
        return {"apiVersion": review_request.get("apiVersion", "admission.k8s.io/v1"),
                "kind": review_request.get("kind", "AdmissionReview"), "response": response}

    return serve


def serve_directly(server: Any, serve: Serve) -> None:
    """Have our webhook server answer our handler's reviews with `serve` instead of kopf's admission path."""
    if hasattr(server, "admit"):
        server.admit = serve


def parse_service(ref: str) -> tuple[str, str, int]:
    """'NAMESPACE/NAME[:PORT]' → (namespace, name, port); port defaults to 443."""
    ns, sep, rest = ref.partition("/")
    name, _, port = rest.partition(":")
    if not sep or not ns or not name:
        raise ValueError(f"webhook service must be NAMESPACE/NAME[:PORT], got {ref!r}")
    return ns, name, int(port or 443)


REACH_TIMEOUT = 30.0  # seconds to wait for our own Service before publishing the configuration anyway


async def until_reachable(host: str, port: int, ca_bundle: Optional[str], timeout: float, *,
                          dial: Optional[tuple[str, int]] = None, interval: float = 0.5) -> bool:
    """Wait until a TLS handshake through `host:port` (our Service) verifies with our CA for that name: then the
    Service routes to a server holding our certificate. False (and a warning) after `timeout`: publish anyway (a
    pod that cannot reach its own Service - no cluster DNS, no hairpin - must still serve the webhook)."""
    ctx = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode() if ca_bundle else None)
    target = dial or (host, port)
    start = time.monotonic()
    last: BaseException | None = None
    while True:
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(target[0], target[1], ssl=ctx, server_hostname=host), timeout=5)
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ssl.SSLError):
                pass
            waited = time.monotonic() - start
            if last is not None:
                log.info("webhook reachable through %s:%d after %.1f s; publishing its configuration", host, port, waited)
            return True
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            last = exc
        if time.monotonic() - start >= timeout:
            log.warning("webhook not reachable through %s:%d after %.0f s (%s); publishing its configuration anyway",
                        host, port, timeout, last)
            return False
        await asyncio.sleep(interval)


# An UPDATE review carries the old and the new object: up to twice etcd's ~1.5 MiB per object, plus the review's own
# fields. aiohttp refuses bodies over 1 MiB by default (413), which made a 0.6 MiB job creatable but never labelled.
MAX_REVIEW_BYTES = 8 * 1024 * 1024


def _large_reviews_class() -> Any:
    import kopf

    class LargeReviewsWebhookServer(kopf.WebhookServer):
        """kopf's server on an event loop of its own, reading review bodies up to MAX_REVIEW_BYTES.

        Its own loop: the TLS handshakes, request parsing and kopf's admission machinery of every review (kopf
        deep-copies each reviewed object, ~0.2 s for the costliest spec the CRD admits) would otherwise run on the
        loop the controller uses, and a tenant's flood of reviews would stall it."""

        admit: Optional[Serve] = None  # serve_directly()

        async def __call__(self, fn: Any) -> AsyncIterator[Any]:
            serving = LoopThread("grpo-webhook")
            direct = self.admit

            async def route(request: Any, *, webhook: Optional[str] = None, headers: Optional[dict[str, str]] = None,
                            sslpeer: Optional[dict[str, Any]] = None) -> Any:
                if direct is not None and webhook == HANDLER_ID:
                    return await direct(request)
                return await fn(request, webhook=webhook, headers=headers, sslpeer=sslpeer)

            # kopf's generator, driven on the webhook's loop (its site lives there). Unwrapped: kopf's context manager
            # would otherwise remember it and close it at exit from the caller's loop, not the loop it serves on.
            raw = getattr(kopf.WebhookServer.__call__, "__wrapped__", None)
            served: Any = raw(self, route) if raw is not None else super().__call__(route)

            steps: list[asyncio.Task[Any]] = []

            async def step() -> Any:
                steps.append(asyncio.current_task())  # type: ignore[arg-type]
                return await served.__anext__()

            async def close() -> None:
                if steps and not steps[-1].done():  # cancelled with us: kopf's own cleanup runs there first
                    await asyncio.wait([steps[-1]])
                await served.aclose()

            try:
                while True:
                    try:
                        config = await serving.call(step())
                    except StopAsyncIteration:
                        return
                    yield config
            finally:
                try:
                    await serving.call(close())
                finally:
                    serving.close()

        @staticmethod
        async def _serve(fn: Any, request: Any) -> Any:
            return await kopf.WebhookServer._serve(fn, request.clone(client_max_size=MAX_REVIEW_BYTES))

    return LargeReviewsWebhookServer


def _service_server_class() -> Any:
    class ServiceWebhookServer(_large_reviews_class()):  # type: ignore[misc]
        """Registers the webhook by Service reference instead of URL.

        In a cluster the API server often cannot resolve `<svc>.<ns>.svc` (it runs outside the cluster DNS), but it
        always reaches a Service reference through its own service proxy.
        """

        def __init__(self, *args: Any, service: tuple[str, str, int], reach_timeout: float = REACH_TIMEOUT,
                     dial: Optional[tuple[str, int]] = None, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.service = service
            self.reach_timeout = reach_timeout
            self.dial = dial  # where to dial instead of the Service's name (tests)

        async def __call__(self, fn: Any) -> Any:
            ns, name, port = self.service
            async for client_config in super().__call__(fn):
                # Published only once the API server can reach us: the configuration is what makes every GRPOJob
                # write call us (failurePolicy Fail), and right after a start (an upgrade: Recreate) the Service
                # has no endpoint for us yet - a `kubectl apply` then failed with "connection refused".
                await until_reachable(f"{name}.{ns}.svc", port, client_config.get("caBundle"),
                                      self.reach_timeout, dial=self.dial)
                config = {k: v for k, v in client_config.items() if k != "url"}
                service: dict[str, Any] = {"namespace": ns, "name": name, "port": port}
                # kopf appends "/<handler id>" to this path: a root of "/" gave "//validate", which the API server
                # refuses ("segment[0] may not be empty") and the operator crash-looped in the cluster.
                if self.path and self.path.strip("/"):
                    service["path"] = "/" + self.path.strip("/")
                config["service"] = service
                yield config

    return ServiceWebhookServer


def server(addr: str, port: int, host: Optional[str], cert_dir: Optional[str], service: Optional[str] = None) -> Any:
    """A kopf.WebhookServer on addr:port with our certificates (generated unless `cert_dir`).

    With `service` ('NAMESPACE/NAME[:PORT]') the managed configuration points at that Service instead of a URL.
    """

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
    kwargs: dict[str, Any] = dict(addr=addr, port=port, host=dial_host, certfile=str(files.certfile),
                  pkeyfile=str(files.keyfile), cafile=str(files.cafile) if files.cafile else None)
    if svc:
        return _service_server_class()(service=svc, **kwargs)
    return _large_reviews_class()(**kwargs)
