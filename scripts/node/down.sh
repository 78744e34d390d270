#!/usr/bin/env bash
# down.sh: stop the cluster that up.sh started, and undo its host changes.
#   * stops exactly the processes recorded in run/pids/*.pid (SIGTERM, then SIGKILL after a grace),
#     plus the containerd shims of *our* containerd (found by their -address argument);
#   * kills/removes every container of our containerd's k8s.io namespace (images are kept);
#   * unmounts everything mounted under $STATE; deletes the CNI bridge; removes the KUBE-*/CNI-*
#     iptables rules and chains; removes the kubepods cgroups; restores the sysctls up.sh saved;
#   * removes /var/log/pods, /var/log/containers, /var/lib/cni/results entries our pods left.
# usage: scripts/node/down.sh [--purge]    (--purge also deletes containerd's root: the imported images)
#        env: STATE=/tmp/grpo-node  KUBE_BIN=<binaries, default .tools/bin>  (the same as for up.sh)
# Written from ../shared/reference/real-node; owned by this project.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${STATE:-/tmp/grpo-node}
RUN=$STATE/run BIN=${KUBE_BIN:-$REPO/.tools/bin} LOG=$STATE/logs
BRIDGE=kn-cni0 CNI_NET=kn-pod-network
SOCK=$RUN/containerd/containerd.sock
CTR=(ctr --address "$SOCK" -n k8s.io)
KUBECTL=${KUBECTL:-$BIN/kubectl}
T0=$(date +%s%N)
log() { local d=$(( ($(date +%s%N) - T0) / 100000000 )); printf '[down %3d.%ds] %s\n' $((d / 10)) $((d % 10)) "$*" >&2; }

pid_of() { [ -s "$RUN/pids/$1.pid" ] && cat "$RUN/pids/$1.pid"; }
# alive = exists and is not a zombie (our daemons' parent is gone: init reaps them, not always at once)
pid_alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
running() { local p; p=$(pid_of "$1") && pid_alive "$p"; }
stop() {  # grace_s name... : SIGTERM all of them at once, SIGKILL whatever is left after grace_s
  local grace=$1 name pid pids=() names=(); shift
  for name in "$@"; do
    pid=$(pid_of "$name") || continue
    pid_alive "$pid" && kill -TERM "$pid" 2>/dev/null && pids+=("$pid") && names+=("$name($pid)")
    rm -f "$RUN/pids/$name.pid"
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  for _ in $(seq $((grace * 10))); do
    local alive=0; for pid in "${pids[@]}"; do pid_alive "$pid" && alive=1; done
    [ $alive = 0 ] && break; sleep 0.1
  done
  for pid in "${pids[@]}"; do pid_alive "$pid" && log "SIGKILL $pid" && kill -KILL "$pid" 2>/dev/null; done
  log "stopped ${names[*]}"
}

# 1. let the kubelet tear pods down through CRI (CNI DEL, volume unmounts) while everything is up
if running kube-apiserver && running kubelet && running containerd; then
  stop 5 kube-controller-manager          # no controller re-creates the pods we delete
  "$KUBECTL" --kubeconfig "$STATE/kubeconfig" delete pods --all-namespaces --all --grace-period=0 --force \
    --wait=false >/dev/null 2>&1
  for _ in $(seq 150); do                 # up to 30 s for the kubelet to stop every sandbox
    [ -z "$("${CTR[@]}" tasks ls -q 2>/dev/null)" ] && break; sleep 0.2
  done
  log "pods deleted; $("${CTR[@]}" tasks ls -q 2>/dev/null | wc -l) tasks left"
fi
stop 10 kube-proxy kubelet kube-scheduler kube-controller-manager
stop 15 kube-apiserver etcd

# 2. whatever containers remain in our containerd: kill, delete (pods' sandboxes included).
#    containerd was killed without this script (a session killed)?  Start it once more, from the
#    same config, so that its metadata is cleaned too (a new up.sh then starts with no stale pods).
# ids of every container/sandbox our containerd knows (for the files it leaves outside $STATE)
ids=$(ls "$RUN/containerd/state/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null)
running containerd && ids="$ids $("${CTR[@]}" containers ls -q 2>/dev/null)"
if ! running containerd && [ -f "$STATE/etc/containerd.toml" ] \
   && [ -f "$RUN/containerd/root/io.containerd.metadata.v1.bolt/meta.db" ]; then
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  mkdir -p "$RUN/pids" "$LOG"
  setsid bash -c 'echo $$ > "$0"; exec containerd --config "$1"' "$RUN/pids/containerd.pid" "$STATE/etc/containerd.toml" \
    >> "$LOG/containerd-cleanup.log" 2>&1 < /dev/null &
  for _ in $(seq 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
  log "started containerd ($(pid_of containerd)) to clean its metadata"
fi
if running containerd; then
  ids="$ids $("${CTR[@]}" containers ls -q 2>/dev/null)"
  for c in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s SIGKILL "$c" >/dev/null 2>&1; done
  sleep 0.5
  for c in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks delete -f "$c" >/dev/null 2>&1; done
  for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers delete "$c" >/dev/null 2>&1; done
fi
stop 10 containerd
# shims of our containerd (they outlive it by design), by PID
for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null); do
  log "killing leftover shim $p"; kill -KILL "$p" 2>/dev/null
done

# container processes live in the kubepods cgroups, outside the caller's cgroup: if containerd and
# its shims were killed without this script (a session killed), they are orphans still running.
orphans=$(cat /sys/fs/cgroup/pids/kubepods/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/cgroup.procs \
  /sys/fs/cgroup/pids/kubepods/*/*/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/*/*/cgroup.procs 2>/dev/null | sort -u)
if [ -n "$orphans" ]; then
  log "killing $(echo $orphans | wc -w) orphaned container processes: $(echo $orphans)"
  kill -KILL $orphans 2>/dev/null; sleep 0.5
fi

# 3. mounts under $STATE (overlay rootfs, shm, netns bind mounts, kubelet volumes), deepest first
for _ in 1 2 3; do
  mapfile -t mnts < <(findmnt -rn -o TARGET | awk -v p="$STATE/" 'index($0, p) == 1' | sort -r)
  [ ${#mnts[@]} -eq 0 ] && break
  for m in "${mnts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
done
left=$(findmnt -rn -o TARGET | awk -v p="$STATE/" 'index($0, p) == 1' | wc -l)
[ "$left" = 0 ] || log "WARNING: $left mounts left under $STATE"

# 4. network: CNI bridge, iptables (kube-proxy's, kubelet's and the CNI plugins' chains)
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE" && log "deleted bridge $BRIDGE"
[ -x "$BIN/kube-proxy" ] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1
for table in nat filter mangle; do
  # rules in built-in chains that jump to KUBE-*/CNI-* chains or carry our CNI network's comment
  iptables-save -t "$table" 2>/dev/null | grep -E '^-A (PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ' \
    | grep -E -- "-j (KUBE-|CNI-)|$CNI_NET" | sed 's/^-A /-D /' | while read -r rule; do
      eval "iptables -t $table $rule" 2>/dev/null
    done
  chains=$(iptables-save -t "$table" 2>/dev/null | awk '/^:(KUBE-|CNI-)/{print substr($1, 2)}')
  for c in $chains; do iptables -t "$table" -F "$c" 2>/dev/null; done
  for c in $chains; do iptables -t "$table" -X "$c" 2>/dev/null; done
done

# 5. cgroups the kubelet created (kubepods hierarchy), deepest first
for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/; do
  [ -d "$h/kubepods" ] || continue
  find "$h/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null
  [ -d "$h/kubepods" ] && log "WARNING: $h/kubepods still there"
done

# 6. files the kubelet/CNI write outside $STATE (hard-coded paths in kubelet 1.20 / libcni)
rm -f /var/lib/cni/results/"$CNI_NET"-* 2>/dev/null
for id in $(echo $ids | tr ' ' '\n' | sort -u); do   # only left when a run was killed
  rm -f /var/lib/cni/results/cni-loopback-"$id"-* 2>/dev/null
  rm -f "/run/containerd/s/$(printf '%s' "$SOCK/k8s.io/$id" | sha256sum | cut -d' ' -f1)" 2>/dev/null
done
find /var/log/containers -maxdepth 1 -type l -lname '/var/log/pods/*' -delete 2>/dev/null
rm -rf /var/log/pods/* 2>/dev/null
rmdir /var/log/containers /var/log/pods /var/lib/cni/results /var/lib/cni 2>/dev/null
rmdir /run/containerd/s /run/containerd 2>/dev/null   # shim sockets' dir (hard-coded in containerd 1.6)

# 7. sysctls back to what they were before up.sh
if [ -f "$RUN/sysctl.orig" ]; then
  while IFS= read -r kv; do sysctl -q -w "$kv" >/dev/null 2>&1 || log "could not restore $kv"; done < "$RUN/sysctl.orig"
  rm -f "$RUN/sysctl.orig"
  log "sysctls restored"
fi

rm -rf --one-file-system "$RUN/containerd/state" "$RUN/containerd/runc" "$RUN/kubelet" "$RUN/etcd" "$RUN/cni-ipam"
[ "${1:-}" = "--purge" ] && rm -rf --one-file-system "$RUN/containerd/root" && log "purged containerd root (images)"
log "down"
