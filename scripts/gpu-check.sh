#!/usr/bin/env bash
# Proves vLLM's two modes, LoRA and sharded training on a CUDA machine in about 10 minutes, offline, and prints steps/s and tokens/s:
#   1. colocate: `python -m grpo_trainer` (the pod's entrypoint) with vllm.mode colocate on GPU 0: vLLM generates and
#      TRL's weight sync lands (vLLM's logprobs keep tracking the trained model at a learning rate that moves it);
#   2. server: the vLLM server argv the operator renders (`grpojob render`), started on the last GPU, healthy on
#      /health; the trainer in server mode pointed at it: TRL's NCCL weight sync into the server, training to the end;
#   3-4. the same with LoRA (spec.peft): the merged weights reach vLLM colocate and the server, the adapter is saved;
#   5-6. spec.parallelism zero3 and fsdp: the DeepSpeed / FSDP arguments the operator renders (render/parallelism.py),
#      accepted by GRPOConfig and trained under torchrun on up to 2 GPUs with vLLM colocated (ZeRO-3: the gathered
#      weights reach vLLM, a full model is saved). ZeRO-3 needs deepspeed in this Python (the CUDA lock must ship it).
#   7. the server kept across a trainer restart (docs/operator.md, "What a restart keeps"): trainer A in server mode
#      is SIGKILLed after step 2 (exit 137, as in a gang restart); the operator's own engine probe
#      (controller/engine_probe.py) finds the kept server healthy; trainer B (new process group, same output dir,
#      attempt 1) resumes from A's checkpoint, opens a new NCCL weight-sync communicator with the same server and
#      trains to the end with the weights reaching vLLM. Prints the time from the kill to B's first step.
#   8. an observation, not a pass: a trainer SIGKILLed in the middle of a weight sync (a hook in its
#      update_named_params, once the server has the update request) and what the engine probe then sees (the
#      wedge rule); then whether a next trainer can still train against that server. Runs last: it may wedge the server.
# GPU_CHECK_CASES="2 7 8" runs only those cases (default: all; the server starts for any of 2, 4, 7, 8): a short
# device lease fits cases 2, 7 and 8.
# The model is examples/local-tiny (built offline by build_assets.py) unless GPU_CHECK_MODEL names another path.
# Needs a Python with the CUDA lock installed (trainer_image/lock-cuda.txt + this project):
#   PYTHON=/opt/venv/bin/python bash scripts/gpu-check.sh      # e.g. inside the CUDA trainer image
# With one GPU the server and the trainer share it (NCCL may refuse two ranks on one device: the script then says so).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
MODEL=${GPU_CHECK_MODEL:-$PWD/examples/local-tiny/model}
DATA=$PWD/examples/local-tiny/data/arithmetic.jsonl
STEPS=${GPU_CHECK_STEPS:-20}
CASES=" ${GPU_CHECK_CASES:-1 2 3 4 5 6 7 8} "
want() { case "$CASES" in *" $1 "*) return 0 ;; esac; return 1; }
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
export TMPDIR=$WORK VLLM_CACHE_ROOT=$WORK/vllm-cache VLLM_RPC_BASE_PATH=$WORK PYTHONPATH=$PWD/trainer_image:$PWD/operator

"$PY" - <<'PY' || { echo "gpu-check: this Python lacks CUDA torch, trl 1.16 or vllm 0.31 (see the header)"; exit 2; }
import torch, trl, vllm
assert torch.cuda.is_available(), "no CUDA device"
print(f"gpu-check: {torch.cuda.device_count()} GPU(s) {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
      f"trl {trl.__version__}, vllm {vllm.__version__}")
PY
[ -f "$MODEL/config.json" ] || "$PY" examples/local-tiny/build_assets.py
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
SERVER_GPU=$((GPUS - 1))

# The trainer config, as the operator renders it; $1 mode, $2 output dir, $3 server port (server mode).
config() {
  "$PY" - "$1" "$2" "${3:-8000}" "$MODEL" "$DATA" "$STEPS" <<'PY'
import json, sys
mode, out, port, model, data, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
print(json.dumps({
    "schemaVersion": 1, "job": {"name": "gpu-check", "namespace": "local"}, "model": model,
    "dataset": {"name": data, "promptColumn": "question", "answerColumn": "answer"},
    "rewards": [{"name": "accuracy"}, {"name": "length", "weight": 0.5}],
    # float32 on both sides so that vLLM's and the trainer's logprobs agree closely when the weights are in sync
    "training": {"per_device_train_batch_size": 16, "num_generations": 4, "max_steps": steps,
                 "max_completion_length": 32, "learning_rate": 1e-2, "logging_steps": 1, "save_strategy": "no",
                 "report_to": "none", "seed": 0, "bf16": False},
    "vllm": {"mode": mode, "gpuMemoryUtilization": 0.3, "serverHost": "127.0.0.1" if mode == "server" else None,
             "serverPort": port},
    "outputDir": out, "progress": {"enabled": True}}))
PY
}

# Reads a trainer log: steps/s, generated tokens/s, vLLM-vs-trainer logprob difference; fails if the sync missed.
report() {
  "$PY" - "$1" "$2" <<'PY'
import ast, sys
name, path = sys.argv[1], sys.argv[2]
steps, runtime = [], None
for line in open(path, encoding="utf-8", errors="replace"):
    line = line.strip()
    if line.startswith("{'loss'"):
        steps.append({k: float(v) for k, v in ast.literal_eval(line).items()})
    elif line.startswith("{'train_runtime'"):
        runtime = float(ast.literal_eval(line)["train_runtime"])
assert steps and runtime, f"{name}: no training logs in {path}"
tokens = sum(s["completions/mean_length"] * 16 for s in steps)
diff = max(s["sampling/sampling_logp_difference/max"] for s in steps)
moved = any(s["grad_norm"] > 0 for s in steps[:-1])
print(f"gpu-check: {name}: {len(steps)} steps, {len(steps) / runtime:.2f} steps/s, {tokens / runtime:.0f} generated "
      f"tokens/s, max |logp vLLM - trainer| {diff:.2e} (model moved: {moved})")
# In sync: ~1e-5 in float32, up to ~0.1 when vLLM runs bf16; a sync that missed: ~10 after a step at lr 1e-2.
if moved and diff > 1.0:
    sys.exit(f"gpu-check: {name}: vLLM's logprobs drifted from the trained model's ({diff:.2e}): the weight sync did not land")
PY
}

t0=$SECONDS
config colocate "$WORK/colocate" > "$WORK/colocate.json"
if want 1; then
echo "gpu-check: 1/8 colocate on GPU 0"
CUDA_VISIBLE_DEVICES=0 timeout 240 "$PY" -m grpo_trainer --config "$WORK/colocate.json" > "$WORK/colocate.log" 2>&1 \
  || { tail -30 "$WORK/colocate.log"; echo "gpu-check: colocate FAILED"; exit 1; }
grep -q "generating with vLLM, colocate mode, on GPU" "$WORK/colocate.log" || { echo "gpu-check: colocate did not use vLLM"; exit 1; }
report colocate "$WORK/colocate.log"
fi

if want 2 || want 4 || want 7 || want 8; then
echo "gpu-check: 2/8 server mode: vLLM server on GPU $SERVER_GPU, trainer on GPU 0"
PORT=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
cat > "$WORK/job.yaml" <<EOF
apiVersion: grpo.dev/v1alpha1
kind: GRPOJob
metadata: {name: gpu-check}
spec:
  model: $MODEL
  dataset: {name: $DATA, promptColumn: question, answerColumn: answer}
  rewards: [{name: accuracy}]
  resources: {limits: {nvidia.com/gpu: 1}}
  training: {perDeviceTrainBatchSize: 16, numGenerations: 4, maxSteps: $STEPS}
  vllm: {mode: server, server: {port: $PORT, gpuMemoryUtilization: 0.3, resources: {limits: {nvidia.com/gpu: 1}}}}
EOF
# The exact argv the operator renders for the server pod (only the bind address moved to loopback).
mapfile -t ARGV < <("$PY" - "$WORK/job.yaml" <<'PY'
import sys
from grpo_operator.cli import documents
from grpo_operator.render import manifests
from grpo_operator.rules import validation
res = validation.validate(documents.load_file(sys.argv[1])[0].body)
assert res.valid, res.errors
pod = next(o for o in manifests.render(res.job, res.topology, "default")
           if o["kind"] == "Pod" and o["metadata"]["labels"]["grpo.dev/role"] == "vllm-server")
c = pod["spec"]["containers"][0]
argv = c["command"] + c["args"]
argv[argv.index("--host") + 1] = "127.0.0.1"
print("\n".join(argv))
PY
)
[ "${#ARGV[@]}" -gt 3 ] || { echo "gpu-check: grpojob's renderer gave no vLLM server argv"; exit 1; }
VLLM_BIN=$(dirname "$PY")/vllm
[ -x "$VLLM_BIN" ] && ARGV[0]=$VLLM_BIN
echo "gpu-check: server argv: ${ARGV[*]}"
server_t0=$SECONDS
CUDA_VISIBLE_DEVICES=$SERVER_GPU VLLM_SERVER_DEV_MODE=1 setsid "${ARGV[@]}" > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 180); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$SERVER_PID" 2>/dev/null || { tail -30 "$WORK/server.log"; echo "gpu-check: the vLLM server exited"; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { tail -30 "$WORK/server.log"; echo "gpu-check: server not healthy"; exit 1; }
SERVER_START_S=$((SECONDS - server_t0))
echo "gpu-check: server healthy after $SERVER_START_S s (its cold start)"
config server "$WORK/server" "$PORT" > "$WORK/server.json"
fi
if want 2 && ! CUDA_VISIBLE_DEVICES=0 timeout 240 "$PY" -m grpo_trainer --config "$WORK/server.json" > "$WORK/trainer.log" 2>&1; then
  tail -30 "$WORK/trainer.log"
  if [ "$GPUS" -lt 2 ] && grep -qi "duplicate gpu" "$WORK/trainer.log" "$WORK/server.log"; then
    echo "gpu-check: server mode needs 2 GPUs here: NCCL refuses the trainer and the server on the same device"
  fi
  echo "gpu-check: server mode FAILED"; exit 1
fi
want 2 && report server "$WORK/trainer.log"

# LoRA (spec.peft): TRL merges the adapter, syncs the merged weights into vLLM and unmerges; the same logprob measure
# shows whether they landed (CPU proves colocate: tests/e2e/vllm/test_vllm_colocate_lora.py; NCCL into a server is
# GPU-only). The server from step 2 is reused: the LoRA trainer pushes its own merged weights into it.
with_lora() {
  "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); d["outputDir"] += "-lora"
d["peft"] = {"r": 8, "alpha": 16, "dropout": 0.0, "targetModules": "all-linear"}; print(json.dumps(d))' "$1"
}
if want 3; then
echo "gpu-check: 3/8 LoRA + vLLM colocate on GPU 0"
with_lora "$WORK/colocate.json" > "$WORK/lora-colocate.json"
CUDA_VISIBLE_DEVICES=0 timeout 240 "$PY" -m grpo_trainer --config "$WORK/lora-colocate.json" > "$WORK/lora-colocate.log" 2>&1 \
  || { tail -30 "$WORK/lora-colocate.log"; echo "gpu-check: LoRA colocate FAILED"; exit 1; }
[ -f "$WORK/colocate-lora/adapter_model.safetensors" ] || { echo "gpu-check: LoRA colocate saved no adapter"; exit 1; }
report lora-colocate "$WORK/lora-colocate.log"
fi
if want 4; then
echo "gpu-check: 4/8 LoRA + vLLM server (merged weights over NCCL)"
with_lora "$WORK/server.json" > "$WORK/lora-server.json"
CUDA_VISIBLE_DEVICES=0 timeout 240 "$PY" -m grpo_trainer --config "$WORK/lora-server.json" > "$WORK/lora-server.log" 2>&1 \
  || { tail -30 "$WORK/lora-server.log"; echo "gpu-check: LoRA server mode FAILED"; exit 1; }
report lora-server "$WORK/lora-server.log"
fi

# spec.parallelism: the trainer config gets exactly what the operator renders for the preset.
with_parallelism() {
  "$PY" -c 'import json, sys
from grpo_operator.api import ParallelismSpec
from grpo_operator.render.parallelism import training_arguments
d = json.load(open(sys.argv[1])); d["outputDir"] += "-" + sys.argv[2]
d["training"].update(training_arguments(ParallelismSpec(strategy=sys.argv[2])))
from trl import GRPOConfig
GRPOConfig(output_dir="/tmp/gpu-check-accepts", **d["training"])  # TRL accepts the rendered arguments
print(json.dumps(d))' "$1" "$2"
}
NPROC=$(( GPUS >= 2 ? 2 : 1 ))
for strategy in zero3 fsdp; do
  n=$([ "$strategy" = zero3 ] && echo 5 || echo 6)
  want "$n" || continue
  echo "gpu-check: $n/8 spec.parallelism $strategy, torchrun $NPROC process(es), vLLM colocate"
  if [ "$strategy" = zero3 ] && ! "$PY" -c "import deepspeed" 2>/dev/null; then
    echo "gpu-check: deepspeed is not installed in this Python: the CUDA lock must ship it (issue 19)"; exit 1
  fi
  with_parallelism "$WORK/colocate.json" "$strategy" > "$WORK/$strategy.json" \
    || { echo "gpu-check: GRPOConfig refused the rendered $strategy arguments"; exit 1; }
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((NPROC - 1))) timeout 300 "$PY" -m grpo_trainer.launch --standalone --nproc-per-node "$NPROC" \
    -m grpo_trainer --config "$WORK/$strategy.json" > "$WORK/$strategy.log" 2>&1 \
    || { tail -30 "$WORK/$strategy.log"; echo "gpu-check: $strategy FAILED"; exit 1; }
  ls "$WORK/colocate-$strategy"/*.safetensors >/dev/null 2>&1 || { echo "gpu-check: $strategy saved no model"; exit 1; }
  report "$strategy" "$WORK/$strategy.log"
done

if want 7 || want 8; then source scripts/gpu-check-restart.sh; fi
echo "gpu-check: OK in $((SECONDS - t0)) s"
