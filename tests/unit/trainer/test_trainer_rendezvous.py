"""launch.wait_for_store: before torchrun's c10d rendezvous, the store's host name must lead to this agent or to a
store that accepts connections. After a gang restart the cluster DNS may still serve the previous pod's IP (seen on
a real node: the new gang hung 100 s on it and restarted again); every try re-resolves. Real sockets on loopback;
the DNS answers are injected (the real DNS's lag is what tests/e2e/node's journey meets)."""

from __future__ import annotations

import socket

import pytest

from grpo_trainer.launch import _join_timeout, wait_for_store

UNREACHABLE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never a live host; a connect fails or times out


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv
    srv.close()


def answers(*addresses):
    """A resolver that answers each call with the next list of addresses (the last one forever)."""
    calls = []

    def resolve(host, port, type=0):
        calls.append(host)
        item = addresses[min(len(calls) - 1, len(addresses) - 1)]
        if isinstance(item, Exception):
            raise item
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, p)) for ip, p in item]

    resolve.calls = calls
    return resolve


def run(endpoint, resolve, *, timeout=30.0, is_host=lambda h: False, on_sleep=None):
    said, slept = [], []

    def sleep(s):
        slept.append(s)
        if on_sleep:
            on_sleep(len(slept))

    outcome = wait_for_store(endpoint, timeout, connect_timeout=0.3, interval=0.01, is_host=is_host,
                             resolve=resolve, sleep=sleep, say=said.append)
    return outcome, said, slept


def test_the_agent_that_hosts_the_store_goes_on_at_once():
    resolve = answers([(UNREACHABLE, 29400)])
    outcome, said, _ = run("tiny-node-0.tiny:29400", resolve, is_host=lambda h: h == "tiny-node-0.tiny")
    assert outcome == "host" and resolve.calls == [] and said == []


def test_a_reachable_store_needs_no_wait(listener):
    port = listener.getsockname()[1]
    outcome, said, slept = run(f"tiny-node-0.tiny:{port}", answers([("127.0.0.1", port)]))
    assert (outcome, said, slept) == ("reachable", [], [])


def test_a_stale_address_is_re_resolved_until_the_new_pod_answers(listener):
    port = listener.getsockname()[1]
    resolve = answers([(UNREACHABLE, port)], [(UNREACHABLE, port)], [("127.0.0.1", port)])
    outcome, said, slept = run(f"tiny-node-0.tiny:{port}", resolve)
    assert outcome == "reachable" and len(resolve.calls) == 3 and len(slept) == 2
    assert said[0].startswith(f"grpo_trainer.launch: waiting for the rendezvous store tiny-node-0.tiny:{port} "
                              f"({UNREACHABLE}: not reachable yet)")
    assert "reachable after" in said[-1] and len(said) == 2


def test_a_refused_connection_waits_for_the_store_to_listen():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]  # bound, not listening: connections are refused
    try:
        outcome, _, slept = run(f"h:{port}", answers([("127.0.0.1", port)]),
                                on_sleep=lambda n: n == 3 and srv.listen(1))
        assert outcome == "reachable" and len(slept) == 3
    finally:
        srv.close()


def test_a_name_that_does_not_resolve_yet_is_retried(listener):
    port = listener.getsockname()[1]
    resolve = answers(socket.gaierror(-2, "Name or service not known"), [("127.0.0.1", port)])
    outcome, said, _ = run(f"tiny-node-0.tiny:{port}", resolve)
    assert outcome == "reachable" and "(no address yet: not reachable yet)" in said[0]


def test_it_gives_up_at_the_join_timeout_and_lets_torchrun_fail_as_before():
    resolve = answers([(UNREACHABLE, 29400)])
    outcome, said, slept = run("tiny-node-0.tiny:29400", resolve, timeout=0.0)
    assert outcome == "timeout" and slept == [] and len(resolve.calls) == 1


def test_torchs_own_host_rule_decides_who_hosts():
    """Without an injected rule, torch's (the one its c10d backend applies next) is used: loopback hosts."""
    assert wait_for_store("localhost:29400", 0.0, resolve=answers([(UNREACHABLE, 29400)])) == "host"
    assert wait_for_store("127.0.0.1:29400", 0.0, resolve=answers([(UNREACHABLE, 29400)])) == "host"


@pytest.mark.parametrize("conf,expected", [("", 600), ("join_timeout=900", 900),
                                           ("read_timeout=60, join_timeout=30", 30), ("join_timeout=x", 600)])
def test_the_wait_is_bounded_by_torchruns_join_timeout(conf, expected):
    assert _join_timeout(conf) == expected
