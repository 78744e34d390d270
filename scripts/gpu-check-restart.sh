# Cases 7 and 8 of scripts/gpu-check.sh (sourced by it, after case 2 started the vLLM server: $PORT, $SERVER_PID,
# $SERVER_START_S, $WORK/server.json, config/report/want). Case 7: the server kept across a trainer restart; case 8:
# a trainer killed inside a weight sync (the wedge rule, docs/operator.md), an observation.

# The operator's own engine probe (controller/engine_probe.py, with the operator's deadline) against the server.
# Exit 0: the engine answered; 1: the probe's verdict is "wedged" (its reason printed).
probe_server() {
  "$PY" - "http://127.0.0.1:$PORT" <<'PY'
import asyncio, sys, time
from grpo_operator.controller.engine_probe import generate_one_token
from grpo_operator.lifecycle.server.order import ENGINE_PROBE_TIMEOUT
start = time.monotonic()
ok, detail = asyncio.run(generate_one_token(sys.argv[1], ENGINE_PROBE_TIMEOUT))
print(f"gpu-check: engine probe of the kept server: {'answered' if ok else detail} "
      f"({time.monotonic() - start:.2f} s, deadline {ENGINE_PROBE_TIMEOUT:g} s)")
sys.exit(0 if ok else 1)
PY
}

# Waits for the event "trainer $2 logged step >= $3 and $4 holds a complete checkpoint" in log $1 (not a time).
wait_for_step() {
  "$PY" - "$@" <<'PY'
import json, os, sys, time
from grpo_trainer import resume
from grpo_trainer.contract import PROGRESS_PREFIX
log, pid, want, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    with open(log, encoding="utf-8", errors="replace") as f:
        steps = [json.loads(line[len(PROGRESS_PREFIX):])["step"] for line in f if line.startswith(PROGRESS_PREFIX)]
    checkpoint = resume.latest_checkpoint(out)
    if steps and max(steps) >= want and checkpoint:
        print(f"gpu-check: trainer A logged step {max(steps)}, {os.path.basename(checkpoint)} saved")
        sys.exit(0)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"gpu-check: trainer A exited before logging step {want} with a checkpoint")
    time.sleep(0.2)  # polling the log for the event; the deadline bounds it
sys.exit(f"gpu-check: trainer A logged no step {want} with a checkpoint within 300 s")
PY
}

if want 7; then
echo "gpu-check: 7/8 the kept server across a trainer restart: trainer A SIGKILLed, the engine probe, trainer B (NCCL)"
# A gang restart keeps the output volume: the new trainers resume from its latest checkpoint (grpo_trainer/resume.py).
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); d["outputDir"] += "-restart"
d["training"].update(save_strategy="steps", save_steps=2); print(json.dumps(d))' "$WORK/server.json" > "$WORK/restart.json"
GRPO_ATTEMPT=0 CUDA_VISIBLE_DEVICES=0 setsid timeout 300 "$PY" -m grpo_trainer --config "$WORK/restart.json" \
  > "$WORK/restart-a.log" 2>&1 &
A_PID=$!
wait_for_step "$WORK/restart-a.log" "$A_PID" 2 "$WORK/server-restart" \
  || { tail -30 "$WORK/restart-a.log"; echo "gpu-check: kept server: trainer A FAILED"; exit 1; }
KILLED_AT=$(date +%s.%N)
kill -KILL -- "-$A_PID"  # the whole process group, as the kubelet kills a container
rc=0; wait "$A_PID" || rc=$?
[ "$rc" = 137 ] || { echo "gpu-check: trainer A ended with $rc, not 137 (SIGKILL)"; exit 1; }
echo "gpu-check: trainer A SIGKILLed (exit $rc)"
probe_server || { tail -30 "$WORK/server.log"; echo "gpu-check: kept server: the engine probe FAILED after an idle kill"; exit 1; }
# Trainer B: a new process group, the next attempt, the same server and output dir.
GRPO_ATTEMPT=1 CUDA_VISIBLE_DEVICES=0 setsid -w timeout 300 "$PY" -m grpo_trainer --config "$WORK/restart.json" \
  > "$WORK/restart-b.log" 2>&1 \
  || { tail -30 "$WORK/restart-b.log"; echo "gpu-check: kept server: trainer B FAILED"; exit 1; }
"$PY" - "$WORK/restart-b.log" "$KILLED_AT" "${SERVER_START_S:-?}" <<'PY'
import json, sys
from grpo_trainer.contract import PROGRESS_PREFIX, RESULT_PREFIX
path, killed_at, server_start = sys.argv[1], float(sys.argv[2]), sys.argv[3]
progress, result = [], None
with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
        if line.startswith(PROGRESS_PREFIX):
            progress.append(json.loads(line[len(PROGRESS_PREFIX):]))
        elif line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
assert result and result.get("resumedFrom"), f"gpu-check: trainer B did not resume from A's checkpoint: {result}"
assert progress, "gpu-check: trainer B logged no step"
first = progress[0]
print(f"gpu-check: trainer B resumed from {result['resumedFrom'].rsplit('/', 1)[-1]}, first step {first['step']}, "
      f"reached step {result['step']}/{result['maxSteps']}")
print(f"gpu-check: kill -> B's first step: {first['timestamp'] - killed_at:.1f} s with the kept server "
      f"(a new server would add its cold start, {server_start} s here)")
PY
report kept-server "$WORK/restart-b.log"
fi

if want 8; then
echo "gpu-check: 8/8 observation: a trainer SIGKILLed inside a weight sync, then the engine probe"
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); d["outputDir"] += "-midsync"
d["training"]["max_steps"] = 6; print(json.dumps(d))' "$WORK/server.json" > "$WORK/midsync.json"
# The hook: TRL's 3rd weight sync (after two steps) posts /update_weights (the workers enter the NCCL receive) and
# broadcasts; the trainer kills itself once that request is fully sent (urllib3's getresponse) and half the tensors
# are handed to the broadcast.
CUDA_VISIBLE_DEVICES=0 setsid -w timeout 300 "$PY" - "$WORK/midsync.json" > "$WORK/midsync.log" 2>&1 <<'PY' || true
import os, signal, sys, threading
import urllib3.connection
from trl.generation import vllm_client

sent = threading.Event()
original_getresponse = urllib3.connection.HTTPConnection.getresponse
def getresponse(self, *args, **kwargs):
    if getattr(self, "_gpu_check_update", False):
        sent.set()  # the whole request is on the socket: the server will read it
    return original_getresponse(self, *args, **kwargs)
urllib3.connection.HTTPConnection.getresponse = getresponse
original_request = urllib3.connection.HTTPConnection.request
def request(self, method, url, *args, **kwargs):
    self._gpu_check_update = url.endswith("/update_weights")
    return original_request(self, method, url, *args, **kwargs)
urllib3.connection.HTTPConnection.request = request

syncs = 0
original_update = vllm_client.VLLMClient.update_named_params
def update_named_params(self, metadata, named_params):
    global syncs
    syncs += 1
    if syncs < 3:
        return original_update(self, metadata, named_params)
    sent.clear()  # set by the earlier syncs' requests: wait for this one's
    def dying():
        for i, item in enumerate(named_params):
            yield item
            if i == len(metadata) // 2:
                request_sent = sent.wait(60)
                print(f"gpu-check: SIGKILL inside weight sync {syncs}, tensor {i + 1}/{len(metadata)} "
                      f"(/update_weights sent: {request_sent})", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    return original_update(self, metadata, dying())
vllm_client.VLLMClient.update_named_params = update_named_params

from grpo_trainer.__main__ import main
os._exit(main(["--config", sys.argv[1]]))
PY
if ! grep -q "gpu-check: SIGKILL inside weight sync" "$WORK/midsync.log"; then
  tail -30 "$WORK/midsync.log"; echo "gpu-check: the mid-sync hook never fired (TRL's sync path changed?): FAILED"; exit 1
fi
grep "gpu-check: SIGKILL inside" "$WORK/midsync.log"
if probe_server; then verdict="healthy (the probe cannot see this wedge)"; else verdict="wedged (the probe detects it)"; fi
echo "gpu-check: OBSERVATION: after a kill inside a weight sync the engine probe says: $verdict"
# Whether a next trainer can still use that server (the operator replaces it when the probe fails, or when trainers
# on a kept server fail before their first step).
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); d["outputDir"] += "-next"; print(json.dumps(d))' \
  "$WORK/midsync.json" > "$WORK/midsync-next.json"
rc=0
CUDA_VISIBLE_DEVICES=0 setsid -w timeout 150 "$PY" -m grpo_trainer --config "$WORK/midsync-next.json" \
  > "$WORK/midsync-next.log" 2>&1 || rc=$?
if [ "$rc" = 0 ]; then echo "gpu-check: OBSERVATION: the next trainer trained to the end against that server"
else tail -5 "$WORK/midsync-next.log"; echo "gpu-check: OBSERVATION: the next trainer failed against that server (exit $rc)"; fi
fi
