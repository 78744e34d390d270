#!/usr/bin/env bash
# The README's first command: set up, validate the tiny example the way the admission webhook would, show what
# the operator would create for it, then train it for real on this machine (2 processes under torchrun, CPU,
# offline, about a minute).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
JOB=examples/local-tiny/grpojob.yaml
.venv/bin/grpojob check "$JOB" examples/minimal.yaml examples/multi-node.yaml
echo "--- the objects the operator would create for it (grpojob render) ---"
.venv/bin/grpojob render "$JOB" | grep -E '^(kind|  name):' | paste - - | sed 's/^/  /'
echo "--- a spec TRL would refuse inside the pod is refused here, with the fix ---"
.venv/bin/grpojob check examples/invalid-batch.yaml || true
echo "--- training ---"
exec .venv/bin/grpojob run --local "$JOB" --output-dir runs/local-tiny --timeout 900
