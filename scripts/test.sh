#!/usr/bin/env bash
# Sets up everything the tests need on a fresh machine (venv, etcd, kube binaries, helm), then runs them all.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -x`; tiers: docs/testing.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
bash scripts/install-test-deps.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# test.sh installed the control-plane binaries above: a missing one is a failure here, not a skip.
export GRPO_TEST_REQUIRE_CLUSTER=1
export PATH="$PWD/.venv/bin:$PWD/.tools/bin:$PATH"
# --durations: the slowest tests in every log (CI has a time limit; docs/testing.md)
exec .venv/bin/python -m pytest -ra --durations=25 "$@"
