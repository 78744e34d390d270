"""A running job's NetworkPolicy kept as rendered (controller/netpols.py, issue 27 Low: the policy was create-only):
what counts as a difference, and what the replacement keeps of the live object."""

from __future__ import annotations

import copy

from grpo_operator.controller import netpols
from grpo_operator.render import netpol
from grpo_operator.rules import validation
from tests.support.jobs import job_body


def rendered(access: netpol.Access = netpol.Access()) -> dict:
    res = validation.validate(job_body("np", nodes=1))
    assert res.job is not None
    return netpol.network_policy(res.job, "team-a", access, uid="u1")


def live_of(want: dict) -> dict:
    """What the API server returns for `want`: the same, plus its own metadata."""
    live = copy.deepcopy(want)
    live["metadata"].update(resourceVersion="7", uid="p1", creationTimestamp="2026-01-01T00:00:00Z")
    return live


def test_the_policy_as_rendered_does_not_differ() -> None:
    want = rendered()
    live = live_of(want)
    live["metadata"]["labels"]["added-by-someone"] = "x"  # labels others add are theirs
    assert not netpols.differs(live, want)


def test_an_opened_policy_or_a_new_operator_namespace_differs() -> None:
    want = rendered()
    opened = live_of(want)
    opened["spec"]["ingress"] = [{}]
    assert netpols.differs(opened, want)
    moved = rendered(netpol.Access(operator_namespace="grpo-moved"))
    assert netpols.differs(live_of(want), moved)
    relabelled = live_of(want)
    relabelled["metadata"]["labels"].pop(next(iter(want["metadata"]["labels"])))
    assert netpols.differs(relabelled, want)


def test_the_replacement_is_the_rendered_policy_on_the_version_read_keeping_what_others_added() -> None:
    want = rendered(netpol.Access(operator_namespace="grpo-moved"))
    live = live_of(rendered())
    live["metadata"]["labels"]["added-by-someone"] = "x"
    live["metadata"]["annotations"] = {"note": "kept"}
    out = netpols.replacement(live, want)
    assert out["spec"] == want["spec"] and out["metadata"]["resourceVersion"] == "7"
    assert out["metadata"]["labels"] == {**want["metadata"]["labels"], "added-by-someone": "x"}
    assert out["metadata"]["annotations"]["note"] == "kept"
    assert netpols.owned_by(live, "u1") and not netpols.owned_by(live, "other")
