#!/usr/bin/env bash
# check.sh: 9 checks against a cluster started by up.sh.  Prints "N passed, N failed"; exit 0 = all passed.
# Creates its objects in the default namespace (and $STATE/volumes) and deletes them again at the end.
#   5  a pod goes Pending -> Running -> Succeeded; kubectl logs
#   3  a pod reaches the API server through the `kubernetes` Service (ClusterIP and DNS name)
#   7  two pods under a headless Service: B resolves A's <host>.<svc> FQDN and connects by IP and name
#   6  SRV record of the headless Service; 6b a non-cluster name is forwarded upstream
#   8  a local PV (no-provisioner StorageClass) + hostPath, written by one pod and read by another
#   9  kill -9 of a container's main process (host PID) -> exit code 137, phase Failed
#   10 a 64Mi memory limit -> OOMKilled;  kubectl exec
# usage: [STATE=/tmp/grpo-node] [NODE=node-0] scripts/node/check.sh   (from ../shared/reference/real-node)
set -u
STATE=${STATE:-/tmp/grpo-node}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NODE=${NODE:-node-0}
PY_IMAGE=local.test/python:3.11-bookworm
DNS_SVC_IP=10.96.0.10
export KUBECONFIG=$STATE/kubeconfig
K=${KUBECTL:-$REPO/.tools/bin/kubectl}
CTR=(ctr --address "$STATE/run/containerd/containerd.sock" -n k8s.io)
VOL=$STATE/volumes
pass=0 fail=0
ok()  { echo "PASS $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
ms()  { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
phase() { $K get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
wait_phase() {  # pod timeout_s phase...
  local pod=$1 t=$2 end p; shift 2; end=$(( $(date +%s) + t ))
  while [ "$(date +%s)" -lt "$end" ]; do
    p=$(phase "$pod"); for want in "$@"; do [ "$p" = "$want" ] && return 0; done; sleep 0.1
  done; return 1
}
cleanup() {
  $K delete pod phases apicheck job-0 job-1 writer reader victim oom --grace-period=0 --force --wait=false >/dev/null 2>&1
  $K delete svc job --wait=false >/dev/null 2>&1
  $K delete pvc data --wait=false >/dev/null 2>&1
  for _ in $(seq 100); do [ -z "$($K get pods -o name 2>/dev/null | grep -E '/(phases|apicheck|job-0|job-1|writer|reader|victim|oom)$')" ] && break; sleep 0.2; done
  $K delete pv local-pv-1 --wait=false >/dev/null 2>&1
  $K delete storageclass local >/dev/null 2>&1
}
apply() { $K apply -f - >/dev/null; }
cleanup

# 5: a pod that prints and exits 0: Pending -> Running -> Succeeded, kubectl logs
t0=$(date +%s%N)
$K run phases --image=$PY_IMAGE --image-pull-policy=Never --restart=Never \
  --command -- python3 -c "import time; time.sleep(2); print('hello from a real pod')" >/dev/null
seen="" last="" t_run=""
for _ in $(seq 300); do
  p=$(phase phases); [ -n "$p" ] && [ "$p" != "$last" ] && seen="$seen $p" && last=$p
  [ "$p" = Running ] && [ -z "$t_run" ] && t_run=$(ms "$t0")
  { [ "$p" = Succeeded ] || [ "$p" = Failed ]; } && break; sleep 0.1
done
[ "$last" = Succeeded ] && [ "$($K logs phases)" = "hello from a real pod" ] \
  && ok "5 pod phases:$seen; apply->Running ${t_run:-?} ms; logs ok" || bad "5 phases:$seen logs: $($K logs phases 2>&1)"

# 3: the API server through the kubernetes Service ClusterIP and its DNS name, from a pod
apply <<EOF
apiVersion: v1
kind: Pod
metadata: {name: apicheck}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: $PY_IMAGE
    imagePullPolicy: Never
    command:
    - python3
    - -c
    - |
      import json, os, ssl, urllib.request
      d = "/var/run/secrets/kubernetes.io/serviceaccount"
      host = os.environ["KUBERNETES_SERVICE_HOST"]; port = os.environ["KUBERNETES_SERVICE_PORT"]
      ctx = ssl.create_default_context(cafile=d + "/ca.crt")
      for url in (f"https://{host}:{port}/version", "https://kubernetes.default.svc/version"):
          req = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(d + "/token").read()})
          print(url, "->", json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["gitVersion"])
EOF
wait_phase apicheck 60 Succeeded Failed
out=$($K logs apicheck 2>&1)
echo "$out" | grep -q "10.96.0.1:443/version -> v1.20.2" && echo "$out" | grep -q "kubernetes.default.svc/version -> v1.20.2" \
  && ok "3 pod -> kubernetes Service (ClusterIP and DNS name)" || bad "3 apicheck: $out"

# 7/6: headless Service, hostname/subdomain DNS, pod-to-pod TCP by IP and by name
apply <<EOF
apiVersion: v1
kind: Service
metadata: {name: job}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: job}
  ports: [{name: c10d, port: 29500}]
---
apiVersion: v1
kind: Pod
metadata: {name: job-0, labels: {app: job}}
spec:
  hostname: job-0
  subdomain: job
  restartPolicy: Never
  containers:
  - name: c
    image: $PY_IMAGE
    imagePullPolicy: Never
    command: [python3, -u, -m, http.server, "29500"]
---
apiVersion: v1
kind: Pod
metadata: {name: job-1, labels: {app: job}}
spec:
  hostname: job-1
  subdomain: job
  restartPolicy: Never
  containers:
  - name: c
    image: $PY_IMAGE
    imagePullPolicy: Never
    command:
    - python3
    - -u
    - -c
    - |
      import socket, time, urllib.request
      peer = "job-0.job.default.svc.cluster.local"
      for i in range(120):
          try:
              ip = socket.gethostbyname(peer); break
          except OSError as e:
              err = e; time.sleep(0.5)
      else:
          raise SystemExit(f"cannot resolve {peer}: {err}")
      print("resolved", peer, "->", ip, "after", i, "tries")
      for url in (f"http://{ip}:29500/", f"http://{peer}:29500/"):
          for j in range(60):
              try:
                  r = urllib.request.urlopen(url, timeout=5); print(url, "->", r.status); break
              except OSError:
                  time.sleep(0.5)
          else:
              raise SystemExit(f"cannot reach {url}")
      print("short name job-0.job ->", socket.gethostbyname("job-0.job"))
EOF
wait_phase job-1 90 Succeeded Failed
out=$($K logs job-1 2>&1)
[ "$(phase job-1)" = Succeeded ] && echo "$out" | grep -q "job-0.job.default.svc.cluster.local:29500/ -> 200" \
  && ok "7 job-1 resolved job-0.job.default.svc.cluster.local and connected (TCP by IP and name)" || bad "7: $out"
srv=$(busybox nslookup -type=SRV _c10d._tcp.job.default.svc.cluster.local $DNS_SVC_IP 2>&1 | grep -c "service = 0 100 29500")
[ "$srv" = 2 ] && ok "6 SRV _c10d._tcp.job: 2 targets" || bad "6 SRV: $srv"
# an upstream name: the host of this machine's Debian mirror (read at run time)
up=$(awk '/^URIs:/{sub(/^[a-z]+:\/\//, "", $2); sub(/\/.*/, "", $2); print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
if [ -n "$up" ]; then
  busybox nslookup "$up" $DNS_SVC_IP 2>&1 | grep -q "^Address: [0-9]" && ok "6b non-cluster name forwarded upstream" \
    || bad "6b upstream forward"
else
  bad "6b: no upstream name to try"
fi

# 8: local PV + hostPath written by one pod, read by another
mkdir -p "$VOL/pv1"; rm -f "$VOL/pv1/msg" "$VOL/hostpath/msg"
apply <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: local}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: local-pv-1}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  local: {path: $VOL/pv1}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  storageClassName: local
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: $PY_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, "echo written-by-\$(hostname) > /data/msg && echo host > /hp/msg"]
    volumeMounts: [{name: data, mountPath: /data}, {name: hp, mountPath: /hp}]
  volumes:
  - {name: data, persistentVolumeClaim: {claimName: data}}
  - {name: hp, hostPath: {path: $VOL/hostpath, type: DirectoryOrCreate}}
EOF
wait_phase writer 60 Succeeded Failed
apply <<EOF
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: $PY_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, "cat /data/msg /hp/msg"]
    volumeMounts: [{name: data, mountPath: /data}, {name: hp, mountPath: /hp}]
  volumes:
  - {name: data, persistentVolumeClaim: {claimName: data}}
  - {name: hp, hostPath: {path: $VOL/hostpath, type: DirectoryOrCreate}}
EOF
wait_phase reader 60 Succeeded Failed
[ "$($K logs reader 2>&1 | tr '\n' ' ')" = "written-by-writer host " ] \
  && ok "8 local PV + hostPath: writer -> reader" || bad "8: $($K logs reader 2>&1)"

# 9: SIGKILL the container's main process from the host -> exit 137, Failed
apply <<EOF
apiVersion: v1
kind: Pod
metadata: {name: victim}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: $PY_IMAGE
    imagePullPolicy: Never
    command: [python3, -c, "import time; print('sleeping', flush=True); time.sleep(3600)"]
EOF
$K wait --for=condition=Ready pod/victim --timeout=60s >/dev/null
cid=$($K get pod victim -o jsonpath='{.status.containerStatuses[0].containerID}'); cid=${cid#containerd://}
pid=$("${CTR[@]}" tasks ls | awk -v c="$cid" '$1 == c {print $2}')
if [ -n "$pid" ]; then
  t0=$(date +%s%N); kill -KILL "$pid"
  wait_phase victim 30 Failed
  code=$($K get pod victim -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}')
  [ "$(phase victim)" = Failed ] && [ "$code" = 137 ] && ok "9 kill -9 host pid $pid -> exit 137, Failed after $(ms "$t0") ms" \
    || bad "9 phase $(phase victim) code $code"
else
  bad "9 no host pid for container $cid"
fi

# 10: memory limit enforced -> OOMKilled
apply <<EOF
apiVersion: v1
kind: Pod
metadata: {name: oom}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: $PY_IMAGE
    imagePullPolicy: Never
    command: [python3, -c, "x = bytearray(300 * 1024 * 1024); print('allocated?')"]
    resources:
      limits: {memory: 64Mi, cpu: 500m}
EOF
wait_phase oom 60 Failed Succeeded
reason=$($K get pod oom -o jsonpath='{.status.containerStatuses[0].state.terminated.reason}')
[ "$reason" = OOMKilled ] && ok "10 memory limit 64Mi -> OOMKilled" || bad "10 oom: $reason"

# 10b: exec into a running pod
[ "$($K exec job-0 -- python3 -c 'print(6*7)' 2>&1)" = 42 ] && ok "10b kubectl exec" || bad "10b kubectl exec"

cleanup
rm -rf "$VOL/pv1" "$VOL/hostpath"; rmdir "$VOL" 2>/dev/null
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
