#!/usr/bin/env bash
# Creates .venv with the operator, the trainer stack (CPU torch) and the test tools. Idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pipi() { .venv/bin/pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true; }
# torch first and pinned: the CPU wheel; anything unpinned would pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || pipi "torch==2.13.0"
pipi -e ".[trainer,test]"
.venv/bin/python -c "import torch, trl, kopf, grpo_operator, grpo_trainer; print('setup: torch', torch.__version__, '| trl', trl.__version__, '| kopf', kopf.__version__)"
