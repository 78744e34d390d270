"""GPU requests → processes per node."""

import pytest

from grpo_operator.rules import topology


@pytest.mark.parametrize("limits,requests,nproc,expected", [
    ({"nvidia.com/gpu": 4}, {}, None, 4),
    ({"nvidia.com/gpu": "4"}, {}, None, 4),
    ({}, {"nvidia.com/gpu": 2}, None, 2),
    ({"amd.com/gpu": 8}, {"amd.com/gpu": "8"}, 8, 8),
    ({"example.org/gpu": 1, "cpu": "500m", "memory": "1Gi"}, {}, None, 1),
    ({"cpu": "4"}, {}, None, 1),
    ({"cpu": "4"}, {}, 3, 3),
    ({}, {}, None, 1),
    ({"nvidia.com/gpu": 0}, {}, 2, 2),
])
def test_nproc(limits, requests, nproc, expected):
    topo, errs = topology.resolve(2, limits, requests, nproc)
    assert not errs
    assert topo.nproc_per_node == expected and topo.world_size == 2 * expected


@pytest.mark.parametrize("limits,requests,nproc,field,words", [
    ({"nvidia.com/gpu": "0.5"}, {}, None, "spec.resources.limits[nvidia.com/gpu]", "whole number"),
    ({"nvidia.com/gpu": "500m"}, {}, None, "spec.resources.limits[nvidia.com/gpu]", "whole number"),
    ({"nvidia.com/gpu": -1}, {}, None, "spec.resources.limits[nvidia.com/gpu]", "whole number"),
    ({"nvidia.com/gpu": 4}, {"nvidia.com/gpu": 2}, None, "spec.resources.requests[nvidia.com/gpu]",
     "requests (2) and limits (4)"),
    ({"nvidia.com/gpu": 4}, {}, 2, "spec.nprocPerNode", "must equal the GPUs per node (4"),
    ({"nvidia.com/gpu": 4, "amd.com/gpu": 4}, {}, None, "spec.resources.limits", "one GPU vendor"),
    ({"nvidia.com/gpu": 10**6}, {}, None, "spec.resources.limits[nvidia.com/gpu]", "more than any node"),
])
def test_errors(limits, requests, nproc, field, words):
    topo, errs = topology.resolve(1, limits, requests, nproc)
    assert topo is None
    assert errs[0].field == field and words in errs[0].message


def test_display_and_field():
    topo, _ = topology.resolve(2, {"nvidia.com/gpu": 8}, {}, None)
    assert topo.display() == "2x8" and topo.nproc_field == "spec.resources.limits[nvidia.com/gpu]"
    topo, _ = topology.resolve(1, {}, {}, 2)
    assert topo.display() == "1x2cpu" and topo.nproc_field == "spec.nprocPerNode"


@pytest.mark.parametrize("raw,count", [(3, 3), ("3", 3), (" 7 ", 7), ("+2", 2), (True, None), ("1e3", None),
                                       ("4Gi", None), ("", None), (None, None), ("99999999999", None)])
def test_parse_gpu_count(raw, count):
    assert topology.parse_gpu_count(raw) == count
