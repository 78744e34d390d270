#!/usr/bin/env bash
# up.sh: a real single-node Kubernetes v1.20.2 cluster; all state under $STATE (default /tmp/grpo-node)
#   etcd 3.4 + kube-apiserver + kube-controller-manager + kube-scheduler (control plane)
#   containerd 1.6 + runc + CNI bridge/host-local/portmap + kubelet + kube-proxy (iptables)
#   cluster-dns (in-cluster DNS for cluster.local, dnslib) as a Deployment behind 10.96.0.10
# Needs root, scripts/install-test-deps.sh (packages, binaries in .tools/bin) and prepare.sh (images).
# Reads only this folder (may be read-only), the binaries and the images.
# Every process it starts is recorded in $STATE/run/pids/*.pid; down.sh stops exactly those.
# If up.sh fails half-way it runs down.sh itself: a failed start leaves nothing behind (logs stay in $STATE/logs).
# Written from ../shared/reference/real-node (its README has the pitfalls); owned by this project.
#
# usage: scripts/node/up.sh [--no-dns]
#   env: STATE=/tmp/grpo-node  NODE=node-0  KUBE_BIN=<binaries, default .tools/bin>  IMAGES=<prepare.sh's>
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${STATE:-/tmp/grpo-node}
NODE=${NODE:-node-0}
BIN=${KUBE_BIN:-$REPO/.tools/bin}
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo-operator}
IMG=${IMAGES:-$CACHE/node-images}
ETC=$STATE/etc PKI=$STATE/pki RUN=$STATE/run LOG=$STATE/logs
KUBECTL=${KUBECTL:-$BIN/kubectl}
# Fixed ports (the kubelet's must be known to the API server), below Linux's ephemeral range (32768-60999):
# a port in that range can be taken at any moment by an outgoing connection or a test's free-port server.
ETCD_PORT=16379 ETCD_PEER_PORT=16380 API_PORT=16443
KCM_PORT=16257 SCHED_PORT=16259
KUBELET_PORT=16250 KUBELET_HEALTHZ_PORT=16248
PROXY_HEALTHZ_PORT=16256 PROXY_METRICS_PORT=16249
SERVICE_CIDR=10.96.0.0/16 API_SVC_IP=10.96.0.1 DNS_SVC_IP=10.96.0.10
POD_SUBNET=10.244.0.0/24 CLUSTER_CIDR=10.244.0.0/16 BRIDGE=kn-cni0 CNI_NET=kn-pod-network
PAUSE_IMAGE=local.test/pause:3.4.1
PY_IMAGE=local.test/python:3.11-bookworm
WITH_DNS=1
[ "${1:-}" = "--no-dns" ] && WITH_DNS=0

T0=$(date +%s%N)
log() { local d=$(( ($(date +%s%N) - T0) / 100000000 )); printf '[up %4d.%ds] %s\n' $((d / 10)) $((d % 10)) "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
pid_alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
[ "$(id -u)" = 0 ] || die "run as root"
for b in etcd containerd ctr runc iptables ip openssl curl busybox; do command -v $b >/dev/null || die "missing $b (prepare.sh)"; done
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  [ -x "$BIN/$b" ] || die "missing $BIN/$b (prepare.sh, KUBE_BIN)"; done
[ -x "$KUBECTL" ] || die "missing kubectl ($KUBECTL)"
if compgen -G "$RUN/pids/*.pid" >/dev/null; then
  for f in "$RUN"/pids/*.pid; do pid_alive "$(cat "$f")" && die "already running ($f): ./down.sh first"; done
fi
# leftovers of a run that was not taken down (pid files of dead processes, mounts, saved sysctls)
if compgen -G "$RUN/pids/*.pid" >/dev/null || [ -f "$RUN/sysctl.orig" ] \
   || [ -n "$(findmnt -rn -o TARGET | awk -v p="$STATE/" 'index($0, p) == 1')" ]; then
  log "stale state from an earlier run: running down.sh first"
  "$HERE/down.sh" || die "down.sh failed"
fi
for p in $ETCD_PORT $ETCD_PEER_PORT $API_PORT $KCM_PORT $SCHED_PORT $KUBELET_PORT $KUBELET_HEALTHZ_PORT \
         $PROXY_HEALTHZ_PORT $PROXY_METRICS_PORT; do
  # (TIME-WAIT of our own last run does not block a listener: the servers set SO_REUSEADDR)
  [ -n "$(ss -Htan exclude time-wait "sport = :$p")" ] && die "port $p is in use: $(ss -Htanp exclude time-wait "sport = :$p" | head -2)"
done

# From here on a failure takes down what was started (and exits with the failure's status).
trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed (rc=$rc): running down.sh (logs stay in $LOG)"; "$HERE/down.sh" || true; fi' EXIT
NODE_IP=$(ip -4 route get 1.1.1.1 | awk '{for(i=1;i<=NF;i++) if($i=="src"){print $(i+1); exit}}')
[ -n "$NODE_IP" ] || die "cannot find the node IP (no default route?)"
UPSTREAM_RESOLV=/etc/resolv.conf
mkdir -p "$RUN/pids" "$LOG" "$ETC/cni/net.d" "$PKI"
# fresh cluster state every time (images in containerd's root are kept)
rm -rf --one-file-system "$RUN/etcd" "$RUN/kubelet" "$RUN/cni-ipam" "$RUN/apiserver-certs" "$RUN/kcm-certs" "$RUN/sched-certs" \
       "$RUN/containerd/state" "$RUN/containerd/runc"
mkdir -p "$RUN/kubelet" "$RUN/cni-ipam" "$RUN/containerd/root" "$RUN/containerd/state"
log "node $NODE ip $NODE_IP"

# ------------------------------------------------------------------ host settings (restored by down.sh)
SYSCTLS="net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.ipv4.conf.all.route_localnet \
 vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
if [ ! -f "$RUN/sysctl.orig" ]; then
  for s in $SYSCTLS; do echo "$s=$(sysctl -n $s)"; done > "$RUN/sysctl.orig"
fi
sysctl -n net.bridge.bridge-nf-call-iptables >/dev/null 2>&1 || modprobe br_netfilter 2>/dev/null || true
sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1

# ------------------------------------------------------------------ PKI (openssl), tokens, kubeconfigs
if [ ! -f "$PKI/ca.crt" ] || [ "$(cat "$PKI/node-ip" 2>/dev/null)" != "$NODE_IP $NODE" ]; then
  log "generating PKI in $PKI"
  rm -rf "$PKI"; mkdir -p "$PKI"
  (
    cd "$PKI"
    openssl genrsa -out ca.key 2048 2>/dev/null
    openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=kube-node-ca" -out ca.crt \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
    sign() {  # name subject extensions
      openssl genrsa -out "$1.key" 2048 2>/dev/null
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
      printf '%b\n' "$3" > "$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -sha256 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:$NODE_IP,IP:$API_SVC_IP,DNS:localhost,DNS:$NODE,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
    sign kubelet "/CN=$NODE" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:$NODE_IP,DNS:$NODE,DNS:localhost"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 600 ./*.key
    echo "$NODE_IP $NODE" > node-ip
  )
  rm -f "$ETC/tokens.csv"
fi
if [ ! -f "$ETC/tokens.csv" ]; then
  tok() { openssl rand -hex 16; }
  {
    echo "$(tok),admin,admin,system:masters"
    echo "$(tok),system:node:$NODE,kubelet,system:nodes"
    echo "$(tok),system:kube-controller-manager,kcm"
    echo "$(tok),system:kube-scheduler,scheduler"
    echo "$(tok),system:kube-proxy,kube-proxy"
  } > "$ETC/tokens.csv"
  chmod 600 "$ETC/tokens.csv"
fi
kubeconfig() {  # file user
  local token; token=$(awk -F, -v u="$2" '$2==u{print $1}' "$ETC/tokens.csv")
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-node
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    token: $token
contexts:
- name: kube-node
  context: {cluster: kube-node, user: "$2"}
current-context: kube-node
EOF
  chmod 600 "$1"
}
kubeconfig "$STATE/kubeconfig" admin
kubeconfig "$ETC/kubelet.kubeconfig" "system:node:$NODE"
kubeconfig "$ETC/kcm.kubeconfig" system:kube-controller-manager
kubeconfig "$ETC/scheduler.kubeconfig" system:kube-scheduler
kubeconfig "$ETC/kube-proxy.kubeconfig" system:kube-proxy
export KUBECONFIG=$STATE/kubeconfig

# ------------------------------------------------------------------ config files
cat > "$ETC/containerd.toml" <<EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$RUN/containerd/containerd.sock"
[debug]
  level = "info"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  netns_mounts_under_state_dir = true
  # this VM has no CAP_SYS_RESOURCE: a negative oom_score_adj (kubelet asks -998 for every pod
  # sandbox, -997 for Guaranteed pods) makes runc fail with "can't get final child's PID from
  # pipe: EOF".  Clamp to containerd's own score (0).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$RUN/containerd/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$ETC/cni/net.d"
    max_conf_num = 1
EOF

rm -f "$ETC"/cni/net.d/*.conflist
cat > "$ETC/cni/net.d/10-kn-bridge.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$RUN/cni-ipam",
        "ranges": [[{"subnet": "$POD_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

cat > "$ETC/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: [$DNS_SVC_IP]
resolvConf: $UPSTREAM_RESOLV
hairpinMode: hairpin-veth
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
maxPods: 110
runtimeRequestTimeout: 5m
syncFrequency: 10s
fileCheckFrequency: 20s
nodeStatusUpdateFrequency: 3s
nodeStatusReportFrequency: 1m
EOF

cat > "$ETC/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $ETC/kube-proxy.kubeconfig
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $CLUSTER_CIDR
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  masqueradeAll: false
  syncPeriod: 30s
  minSyncPeriod: 0s
EOF

# ------------------------------------------------------------------ helpers
start() {  # name argv... : detached (own session), pid -> run/pids/name.pid, log -> logs/name.log
  local name=$1; shift
  : > "$LOG/$name.log"
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$RUN/pids/$name.pid" "$@" >> "$LOG/$name.log" 2>&1 < /dev/null &
  for _ in $(seq 50); do [ -s "$RUN/pids/$name.pid" ] && break; sleep 0.1; done
  log "started $name (pid $(cat "$RUN/pids/$name.pid"))"
}
alive() { pid_alive "$(cat "$RUN/pids/$1.pid")" || die "$1 died: tail $LOG/$1.log"; }
wait_for() {  # what timeout_s proc cmd...
  local what=$1 t=$2 proc=$3; shift 3
  local end=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    [ -n "$proc" ] && alive "$proc"
    [ "$(date +%s)" -lt "$end" ] || die "timeout waiting for $what"
    sleep 0.2
  done
  log "$what: ok"
}
CURL_ADMIN=(curl -sf --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(awk -F, '$2=="admin"{print $1}' "$ETC/tokens.csv")")
k() { "$KUBECTL" --kubeconfig "$STATE/kubeconfig" "$@"; }

# ------------------------------------------------------------------ containerd + images
start containerd containerd --config "$ETC/containerd.toml"
CTR=(ctr --address "$RUN/containerd/containerd.sock" -n k8s.io)
wait_for "containerd socket" 30 containerd "${CTR[@]}" version
# (no `cmd | grep -q` under pipefail: grep -q exits at the first match, cmd gets SIGPIPE, the
#  pipeline "fails" at random)
have_image() { local all; all=$("${CTR[@]}" images ls -q) && grep -qx "$1" <<< "$all"; }
import_image() {  # ref oci-archive
  if ! have_image "$1"; then
    [ -f "$2" ] || die "missing $2 (prepare.sh)"
    "${CTR[@]}" images import "$2" >/dev/null
    have_image "$1" || die "import of $2 did not give $1"
    log "imported $1"
  fi
}
import_image "$PAUSE_IMAGE" "$IMG/pause-oci.tar"
[ -f "$IMG/python-oci.tar" ] && import_image "$PY_IMAGE" "$IMG/python-oci.tar"

# ------------------------------------------------------------------ etcd + kube-apiserver
start etcd etcd --name="$NODE" --data-dir="$RUN/etcd" \
  --listen-client-urls=http://127.0.0.1:$ETCD_PORT --advertise-client-urls=http://127.0.0.1:$ETCD_PORT \
  --listen-peer-urls=http://127.0.0.1:$ETCD_PEER_PORT --initial-advertise-peer-urls=http://127.0.0.1:$ETCD_PEER_PORT \
  --initial-cluster="$NODE"=http://127.0.0.1:$ETCD_PEER_PORT --initial-cluster-state=new \
  --logger=zap --log-level=warn --quota-backend-bytes=1073741824
wait_for "etcd /health" 30 etcd sh -c "curl -sf http://127.0.0.1:$ETCD_PORT/health | grep -q true"

start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers=http://127.0.0.1:$ETCD_PORT \
  --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=$API_PORT --insecure-port=0 \
  --cert-dir="$RUN/apiserver-certs" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" --token-auth-file="$ETC/tokens.csv" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --service-cluster-ip-range=$SERVICE_CIDR --allow-privileged=true --profiling=false --v=1
wait_for "kube-apiserver /readyz" 90 kube-apiserver "${CURL_ADMIN[@]}" "https://127.0.0.1:$API_PORT/readyz"

# ------------------------------------------------------------------ controller-manager + scheduler
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig="$ETC/kcm.kubeconfig" --authentication-kubeconfig="$ETC/kcm.kubeconfig" \
  --authorization-kubeconfig="$ETC/kcm.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=$KCM_PORT --port=0 --cert-dir="$RUN/kcm-certs" \
  --leader-elect=false --use-service-account-credentials=true --controllers='*' \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --profiling=false --v=1
start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig="$ETC/scheduler.kubeconfig" --authentication-kubeconfig="$ETC/scheduler.kubeconfig" \
  --authorization-kubeconfig="$ETC/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=$SCHED_PORT --port=0 --cert-dir="$RUN/sched-certs" \
  --leader-elect=false --profiling=false --v=1

# ------------------------------------------------------------------ kubelet + kube-proxy
start kubelet "$BIN/kubelet" --config="$ETC/kubelet.yaml" --kubeconfig="$ETC/kubelet.kubeconfig" \
  --container-runtime=remote --container-runtime-endpoint="unix://$RUN/containerd/containerd.sock" \
  --image-service-endpoint="unix://$RUN/containerd/containerd.sock" \
  --root-dir="$RUN/kubelet" --cert-dir="$RUN/kubelet/pki" --volume-plugin-dir="$RUN/kubelet/volume-plugins" \
  --hostname-override="$NODE" --node-ip="$NODE_IP" --v=1
start kube-proxy "$BIN/kube-proxy" --config="$ETC/kube-proxy.yaml" --v=1
wait_for "kube-controller-manager /healthz" 60 kube-controller-manager curl -skf "https://127.0.0.1:$KCM_PORT/healthz"
wait_for "kube-scheduler /healthz" 60 kube-scheduler curl -skf "https://127.0.0.1:$SCHED_PORT/healthz"
wait_for "kube-proxy /healthz" 60 kube-proxy curl -sf "http://127.0.0.1:$PROXY_HEALTHZ_PORT/healthz"
wait_for "node $NODE Ready" 120 kubelet sh -c \
  "'$KUBECTL' --kubeconfig '$STATE/kubeconfig' get node '$NODE' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
wait_for "default service account" 60 "" k get serviceaccount default -n default

# ------------------------------------------------------------------ cluster DNS (cluster-dns)
if [ "$WITH_DNS" = 1 ]; then
  if ! have_image "$PY_IMAGE"; then
    log "no $PY_IMAGE: skipping DNS (prepare.sh)"
  else
    k -n kube-system create configmap cluster-dns --from-file=cluster-dns.py="$HERE/cluster-dns.py" \
      --dry-run=client -o yaml | k apply -f - >/dev/null
    sed -e "s|@PY_IMAGE@|$PY_IMAGE|g" -e "s|@DNS_SVC_IP@|$DNS_SVC_IP|g" "$HERE/cluster-dns.yaml" | k apply -f - >/dev/null
    wait_for "cluster-dns rollout" 120 "" k -n kube-system rollout status deployment/cluster-dns --timeout=2s
    wait_for "DNS answers kubernetes.default" 60 "" sh -c \
      "busybox nslookup kubernetes.default.svc.cluster.local $DNS_SVC_IP | grep -q '$API_SVC_IP'"
  fi
fi
log "cluster up: export KUBECONFIG=$STATE/kubeconfig; $KUBECTL get nodes"
