"""webhook.review(): the admission decision (the same validator as `grpojob check`) and the update rules."""

from __future__ import annotations

import copy
import ssl

import pytest

from grpo_operator.rules import validation
from grpo_operator.webhook import certs
from grpo_operator.webhook import review as webhook
from grpo_operator.webhook import server as webhook_server
from tests.support.jobs import job_body


def test_valid_create_is_allowed_with_warnings_passed_through() -> None:
    body = job_body("job", nodes=1)
    del body["spec"]["output"]["volumeClaimName"]
    r = webhook.review("CREATE", body)
    assert r.allowed and any("volumeClaimName" in w for w in r.warnings)


def test_invalid_create_is_denied_with_field_numbers_valid_values_and_fix() -> None:
    body = job_body("job", nodes=1, gpus=3, per_device=1, num_generations=8)
    r = webhook.review("CREATE", body)
    assert not r.allowed
    res = validation.validate(body)
    for e in res.errors:  # exactly the validator's messages
        assert e.field in r.message and e.message in r.message
    assert "spec.training.numGenerations" in r.message and "Valid numGenerations" in r.message and "→" in r.message


def test_schema_errors_are_denied() -> None:
    body = job_body("job")
    body["spec"]["trainig"] = {}
    r = webhook.review("CREATE", body)
    assert not r.allowed and "trainig" in r.message


def test_update_of_immutable_fields_is_denied() -> None:
    old = job_body("job", nodes=2)
    for path, value in ((("nodes",), 4), (("model",), "other/model"), (("dataset", "name"), "x/y"),
                        (("training", "numGenerations"), 4), (("resources", "limits", "nvidia.com/gpu"), 8)):
        new = copy.deepcopy(old)
        target = new["spec"]
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
        r = webhook.review("UPDATE", new, old)
        assert not r.allowed, path
        assert f"spec.{path[0]}" in r.message and "cannot change" in r.message


def test_update_of_run_policy_and_metadata_is_allowed() -> None:
    old = job_body("job", nodes=2)
    new = copy.deepcopy(old)
    new["spec"]["runPolicy"]["suspend"] = True
    new["spec"]["runPolicy"]["backoffLimit"] = 7
    new["metadata"]["labels"] = {"team": "a"}
    assert webhook.review("UPDATE", new, old).allowed


def test_template_may_change_only_while_suspended() -> None:
    old = job_body("job", nodes=1)
    new = copy.deepcopy(old)
    new["spec"]["template"] = {"nodeSelector": {"pool": "a100"}}
    r = webhook.review("UPDATE", new, old)
    assert not r.allowed and "suspended" in r.message
    old_s = job_body("job", nodes=1, suspend=True)
    new_s = copy.deepcopy(old_s)
    new_s["spec"]["template"] = {"nodeSelector": {"pool": "a100"}}
    assert webhook.review("UPDATE", new_s, old_s).allowed


def test_rejected_job_may_be_fixed_freely() -> None:
    old = job_body("job", nodes=1, gpus=3, per_device=1, num_generations=8)
    new = job_body("job", nodes=1, gpus=4, per_device=2, num_generations=8)
    assert webhook.review("UPDATE", new, old).allowed


def test_update_to_invalid_is_denied() -> None:
    old = job_body("job", nodes=1)
    new = copy.deepcopy(old)
    new["spec"]["runPolicy"]["backoffLimit"] = -1
    r = webhook.review("UPDATE", new, old)
    assert not r.allowed and "backoffLimit" in r.message


def test_delete_and_other_operations_are_allowed() -> None:
    assert webhook.review("DELETE", None, job_body("job")).allowed


def test_generated_certificates_verify_for_the_host(tmp_path) -> None:
    files = certs.generate(tmp_path, ["127.0.0.1", "grpo-operator.ns.svc"])
    ctx = ssl.create_default_context(cafile=str(files.cafile))
    srv = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    srv.load_cert_chain(str(files.certfile), str(files.keyfile))
    assert (files.keyfile.stat().st_mode & 0o077) == 0
    loaded = certs.from_dir(tmp_path)
    assert loaded.certfile == files.certfile and loaded.cafile == files.cafile
    import socket
    import threading

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]

    def serve() -> None:
        conn, _ = lsock.accept()
        with srv.wrap_socket(conn, server_side=True) as s:
            s.sendall(b"ok")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    for host in ("127.0.0.1", "grpo-operator.ns.svc"):
        if host != "127.0.0.1":
            break  # DNS name: checked via the SAN list below
        with socket.create_connection(("127.0.0.1", port)) as raw, ctx.wrap_socket(raw, server_hostname=host) as s:
            assert s.recv(2) == b"ok"
    t.join(5)
    lsock.close()
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(files.certfile.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "grpo-operator.ns.svc" in sans.get_values_for_type(x509.DNSName)


@pytest.mark.asyncio
async def test_service_reference_server_registers_by_service(tmp_path):
    """In-cluster installs register the webhook by Service reference (API servers often can't resolve .svc)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = webhook_server.server("127.0.0.1", port, "127.0.0.1", None, "grpo-system/grpo-webhook:9443")
    srv.dial = ("127.0.0.1", port)  # the Service's name does not resolve here (test_webhook_in_cluster.py)
    async with srv:
        gen = srv(lambda *a, **k: None)
        config = await gen.__anext__()
        await gen.aclose()
    assert "url" not in config and config["caBundle"]
    # no path: kopf appends "/validate" itself (a "/" here made "//validate"; test_webhook_in_cluster.py)
    assert config["service"] == {"namespace": "grpo-system", "name": "grpo-webhook", "port": 9443}
    with pytest.raises(ValueError):
        webhook_server.parse_service("no-namespace")
