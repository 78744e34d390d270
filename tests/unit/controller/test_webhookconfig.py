"""The operator's own webhook configuration writer (controller/webhookconfig.py): what it writes, and that it only
patches (creates when allowed), and never touches a mutating configuration."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_operator.controller import kube as kube_mod
from grpo_operator.controller import webhookconfig as wc


def test_handler_path_is_appended_like_kopf() -> None:
    assert wc.with_handler_path({"url": "https://h:9443/"}, "validate") == {"url": "https://h:9443/validate"}
    svc = wc.with_handler_path({"service": {"namespace": "n", "name": "s", "port": 443}}, "validate")
    assert svc["service"]["path"] == "/validate"


@pytest.mark.parametrize("version, selector", [
    ({"major": "1", "minor": "20"}, False), ({"major": "1", "minor": "21+"}, True), ({"major": "1", "minor": "30"}, True),
    ({}, False),
])
def test_namespace_selector_only_where_namespaces_carry_the_name_label(version: dict[str, str], selector: bool) -> None:
    got = wc.namespace_selector(["b", "a"], wc.server_minor(version))
    assert (got is not None) == selector
    if got:
        assert got["matchExpressions"] == [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}]
    assert wc.namespace_selector([], (1, 30)) is None  # cluster-wide


class Recorder:
    def __init__(self, exists: bool, minor: str = "30"):
        self.exists, self.minor, self.calls = exists, minor, []

    async def request(self, method: str, path: str, *, body: Any = None, fenced: bool = True, **_: Any) -> Any:
        self.calls.append((method, path, fenced))
        if method == "GET" and path == "/version":
            return {"major": "1", "minor": self.minor}
        if method == "PATCH" and not self.exists:
            raise kube_mod.NotFound(404, "NotFound", "missing")
        self.body = body
        return {}


@pytest.mark.asyncio
async def test_patches_the_one_configuration_with_a_selector() -> None:
    k = Recorder(exists=True)
    pub = wc.Publisher(lambda: k, "cfg.grpo.dev", "validate", ["team"], create=False)  # type: ignore[arg-type, return-value]
    await pub.publish({"url": "https://h:1"})
    assert [c[:2] for c in k.calls] == [("GET", "/version"),
                                        ("PATCH", f"{wc.VWC_PATH}/cfg.grpo.dev")]
    assert all(not fenced for m, _, fenced in k.calls if m != "GET")  # every replica serves (and publishes) the webhook
    (hook,) = k.body["webhooks"]
    assert hook["name"] == "validate.cfg.grpo.dev" and hook["clientConfig"]["url"] == "https://h:1/validate"
    assert hook["failurePolicy"] == "Fail" and hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["team"]
    assert not any("mutating" in p for _, p, _ in k.calls)


@pytest.mark.asyncio
async def test_the_charts_failure_policy_is_written() -> None:
    """Low finding of issue 27: the operator-managed configuration always said failurePolicy Fail, whatever the
    chart's webhook.failurePolicy (GRPO_WEBHOOK_FAILURE_POLICY) asked for."""
    from grpo_operator.controller import settings

    k = Recorder(exists=True)
    cfg = settings.Settings.from_env({"GRPO_WEBHOOK_FAILURE_POLICY": "Ignore"})
    assert cfg.webhook_failure_policy == "Ignore"
    pub = wc.Publisher(lambda: k, "cfg", "validate", [], create=False,  # type: ignore[arg-type, return-value]
                       failure_policy=cfg.webhook_failure_policy)
    await pub.publish({"url": "https://h:1"})
    assert k.body["webhooks"][0]["failurePolicy"] == "Ignore"
    bad = settings.Settings.from_env({"GRPO_WEBHOOK_FAILURE_POLICY": "Sometimes"})
    assert "GRPO_WEBHOOK_FAILURE_POLICY must be Fail or Ignore" in (settings.check(bad) or "")


@pytest.mark.asyncio
async def test_creates_only_when_allowed() -> None:
    k = Recorder(exists=False, minor="20")
    pub = wc.Publisher(lambda: k, "cfg", "validate", ["team"], create=False)  # type: ignore[arg-type, return-value]
    with pytest.raises(RuntimeError, match="only patches"):
        await pub.publish({"url": "https://h:1"})
    assert [m for m, _, _ in k.calls] == ["GET", "PATCH"]
    k2 = Recorder(exists=False, minor="20")
    pub2 = wc.Publisher(lambda: k2, "cfg", "validate", ["team"], create=True)  # type: ignore[arg-type, return-value]
    await pub2.publish({"url": "https://h:1"})
    assert [m for m, _, _ in k2.calls] == ["GET", "PATCH", "POST"]
    assert "namespaceSelector" not in k2.body["webhooks"][0]  # 1.20: namespaces have no name label
