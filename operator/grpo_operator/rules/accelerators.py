"""Every extended resource name that is an accelerator, what the trainer can do with it, and why (pure).

The trainer runs torch's "nccl" backend on CUDA devices (CUDA images; ROCm builds of torch expose the same API and
RCCL under the same name, so AMD GPUs run in an image built for them). NCCL cannot connect two MIG instances (a MIG
instance has no peer-to-peer or CUDA IPC access, and NCCL refuses to build a communicator across MIG devices), so a
MIG device serves a job with one training process and no vLLM server to sync with. Other vendors' devices need a
torch backend (xpu, hpu, neuron, xla) the trainer does not set up."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Optional

Kind = Literal["nvidia", "mig", "amd", "unsupported"]

NVIDIA_GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
MIG_RE = re.compile(r"^nvidia\.com/mig-[0-9]+g\.[0-9]+gb(\.[a-z0-9+.-]*)?$")
# Resource names of device plugins that are accelerators the trainer cannot drive.
_UNSUPPORTED = {
    "gpu.intel.com/i915": "Intel GPUs need torch's xpu backend (oneCCL), which the trainer image does not set up",
    "gpu.intel.com/xe": "Intel GPUs need torch's xpu backend (oneCCL), which the trainer image does not set up",
    "habana.ai/gaudi": "Gaudi accelerators need torch's hpu backend (HCCL), which the trainer image does not set up",
    "aws.amazon.com/neuron": "AWS Neuron devices need torch-neuronx (XLA), which the trainer image does not set up",
    "aws.amazon.com/neuroncore": "AWS Neuron devices need torch-neuronx (XLA), which the trainer image does not set up",
    "aws.amazon.com/neurondevice": "AWS Neuron devices need torch-neuronx (XLA), which the trainer image does not "
                                   "set up",
    "google.com/tpu": "TPUs need torch_xla, which the trainer image does not set up",
}
GPU_SUFFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/gpu$")  # any vendor's */gpu: a GPU (rules/topology.py)


@dataclass(frozen=True)
class Accelerator:
    name: str
    kind: Kind
    reason: str = ""  # why it is refused (unsupported), or the condition it is accepted under


def classify(name: str) -> Optional[Accelerator]:
    """The accelerator a resource name requests, or None when it is not one."""
    if name == NVIDIA_GPU:
        return Accelerator(name, "nvidia")
    if MIG_RE.match(name):
        return Accelerator(name, "mig", "NCCL does not support communication between MIG instances (no peer-to-peer "
                                        "or CUDA IPC across them)")
    if name == AMD_GPU:
        return Accelerator(name, "amd", "the operator's trainer images are CUDA (and CPU) builds: AMD GPUs need a "
                                        "ROCm build of torch and vLLM")
    if name in _UNSUPPORTED:
        return Accelerator(name, "unsupported", _UNSUPPORTED[name])
    if GPU_SUFFIX_RE.match(name):
        return Accelerator(name, "nvidia")  # another vendor's */gpu device plugin: driven as CUDA (as before)
    return None


def is_accelerator(name: str) -> bool:
    return classify(name) is not None


def problems(limits: Mapping[str, object], requests: Mapping[str, object], path: str, *, own_image: bool,
             world_size: int, server: bool, counts: Mapping[str, int]) -> list[tuple[str, str]]:
    """Accelerators the job cannot run on, with the reason: `counts` the devices per pod (by resource name),
    `world_size` the training processes of the job, `server` whether trainers sync weights to a vLLM server."""
    out = []
    for name in sorted(set(limits) | set(requests)):
        acc = classify(name)
        if acc is None or not counts.get(name):
            continue
        where = f"{path}.limits[{name}]"
        if acc.kind == "unsupported":
            out.append((where, f"{name} is an accelerator the trainer cannot use: {acc.reason}; use "
                               f"{NVIDIA_GPU} (or CPU)"))
        elif acc.kind == "amd" and not own_image:
            out.append((where, f"{name}: {acc.reason}. Set spec.image to a ROCm trainer image built from "
                               "trainer_image/ (torch's ROCm build runs the same code), or use nvidia.com/gpu"))
        elif acc.kind == "mig" and (counts[name] > 1 or world_size > 1 or server):
            out.append((where, f"{name}: a MIG device serves one training process only, with no vLLM server: "
                               f"{acc.reason}, and this job would connect {max(world_size, 2)} processes"
                               + (" (the server's weight sync is NCCL too)" if server else "")
                               + f". Use 1 MIG device on 1 node with vllm.mode colocate or none, or whole GPUs "
                               f"({NVIDIA_GPU})"))
    return out
