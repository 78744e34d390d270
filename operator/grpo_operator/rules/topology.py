"""GPU requests → torchrun processes per node and world size (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Union

from . import accelerators

# Extended resources whose name ends in /gpu (nvidia.com/gpu, amd.com/gpu), and every other accelerator
# rules/accelerators.py knows (MIG devices; the ones it refuses still set the process count of the message).
GPU_RESOURCE_RE = accelerators.GPU_SUFFIX_RE
WHOLE_NUMBER_RE = re.compile(r"^\+?[0-9]+$")
# The most GPUs a node of any real cluster has (8 is usual, 16 the largest boards): a bigger count is a typo.
MAX_GPUS_PER_NODE = 16


@dataclass(frozen=True)
class TopologyError:
    field: str
    message: str


@dataclass(frozen=True)
class Topology:
    nodes: int
    nproc_per_node: int
    gpu_resource: Optional[str]  # e.g. nvidia.com/gpu; None for CPU-only jobs
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def nproc_field(self) -> str:
        """The spec field a user changes to change nproc_per_node (for fix messages)."""
        return f"spec.resources.limits[{self.gpu_resource}]" if self.gpu_resource else "spec.nprocPerNode"

    def display(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}" if self.gpu_resource else f"{self.nodes}x{self.nproc_per_node}cpu"


def parse_gpu_count(value: Union[int, str, None]) -> Optional[int]:
    """A whole number of GPUs from an int or a quantity string; None when it is not one ("0.5", "1k", "abc")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and WHOLE_NUMBER_RE.match(value.strip()) and len(value) <= 10:
        return int(value.strip())
    return None


def is_gpu_resource(name: str) -> bool:
    return accelerators.is_accelerator(name)


def resolve(
    nodes: int,
    limits: Mapping[str, Union[int, str]],
    requests: Mapping[str, Union[int, str]],
    nproc_per_node: Optional[int],
    field_prefix: str = "spec",
) -> tuple[Optional[Topology], list[TopologyError]]:
    errors: list[TopologyError] = []
    counts: dict[str, int] = {}
    for where, table in (("limits", limits), ("requests", requests)):
        for name, raw in table.items():
            if not is_gpu_resource(name):
                continue
            n = parse_gpu_count(raw)
            path = f"{field_prefix}.resources.{where}[{name}]"
            if n is None:
                errors.append(TopologyError(
                    path, f"GPU count must be a whole number of GPUs (an integer like 4 or \"4\"), got {raw!r}."))
                continue
            if n > MAX_GPUS_PER_NODE:
                errors.append(TopologyError(path, f"{n} GPUs per node is more than any node has (at most "
                                                  f"{MAX_GPUS_PER_NODE}); use more nodes instead."))
                continue
            if name in counts and counts[name] != n:
                errors.append(TopologyError(
                    f"{field_prefix}.resources.requests[{name}]",
                    f"requests ({n}) and limits ({counts[name]}) of {name} differ; Kubernetes requires them equal for "
                    f"GPUs: set both to {counts[name]} (or set only limits).",
                ))
                continue
            counts[name] = n
    positive = {k: v for k, v in counts.items() if v > 0}
    if len(positive) > 1:
        errors.append(TopologyError(f"{field_prefix}.resources.limits",
                                    f"one GPU vendor per job: got {sorted(positive)}; keep one."))
    if errors:
        return None, errors
    if positive:
        (gpu_name, gpus), = positive.items()
        if nproc_per_node is not None and nproc_per_node != gpus:
            return None, [TopologyError(
                f"{field_prefix}.nprocPerNode",
                f"nprocPerNode ({nproc_per_node}) must equal the GPUs per node ({gpus} {gpu_name}): one training "
                f"process per GPU. Set nprocPerNode: {gpus} or remove it.",
            )]
        return Topology(nodes, gpus, gpu_name, gpus), []
    return Topology(nodes, nproc_per_node or 1, None, 0), []
