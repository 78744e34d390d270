#!/usr/bin/env bash
# prepare.sh: what up.sh needs besides the Debian packages and binaries that scripts/install-test-deps.sh
# installs: the two images of the node itself, built once and cached by their inputs' hash.
#   pause   local.test/pause:3.4.1            (pause.c here, static)  - the pod sandbox
#   python  local.test/python:3.11-bookworm   (mmdebstrap bookworm minbase + python3, python3-dnslib,
#                                              busybox-static)        - runs cluster-dns.py
# Idempotent; reads only this folder, writes only under $IMAGES.  Needs root.
#
# usage: scripts/node/prepare.sh      env: IMAGES (default ~/.cache/grpo-operator/node-images)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo-operator}
IMAGES=${IMAGES:-$CACHE/node-images}
KUBE_BIN=${KUBE_BIN:-$REPO/.tools/bin}
PAUSE_IMAGE=local.test/pause:3.4.1
PY_IMAGE=local.test/python:3.11-bookworm
T0=$(date +%s)
log() { printf '[node/prepare %3ds] %s\n' $(( $(date +%s) - T0 )) "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"
for b in containerd ctr runc iptables conntrack ip openssl curl busybox gcc mmdebstrap etcd; do
  command -v $b >/dev/null || die "missing $b: run scripts/install-test-deps.sh"
done
[ -x /usr/lib/cni/bridge ] || die "missing /usr/lib/cni/bridge (containernetworking-plugins): run scripts/install-test-deps.sh"
for b in kubelet kube-scheduler kube-proxy kube-apiserver kube-controller-manager kubectl; do
  [ -x "$KUBE_BIN/$b" ] || die "missing $KUBE_BIN/$b: run scripts/install-test-deps.sh"
done
mkdir -p "$IMAGES"

# The cache key of each image: the files it is made from (a changed pause.c or mkimage.py rebuilds).
key() { cat "$@" | sha256sum | cut -c1-16; }

pause_key=$(key "$HERE/pause.c" "$HERE/mkimage.py")
if [ ! -f "$IMAGES/pause-$pause_key.tar" ]; then
  tmp=$(mktemp -d "$IMAGES/pause.XXXXXX")
  mkdir -p "$tmp/root"
  gcc -Os -Wall -Werror -static -DVERSION=v3.4.1-local -o "$tmp/root/pause" "$HERE/pause.c"
  strip "$tmp/root/pause"
  tar -C "$tmp/root" -cf "$tmp/rootfs.tar" ./pause
  python3 "$HERE/mkimage.py" "$tmp/rootfs.tar" "$tmp/out.tar" "$PAUSE_IMAGE" --entrypoint '["/pause"]' >/dev/null
  mv "$tmp/out.tar" "$IMAGES/pause-$pause_key.tar"
  rm -rf "$tmp"
fi
ln -sfn "pause-$pause_key.tar" "$IMAGES/pause-oci.tar"

py_key=$(key "$HERE/mkimage.py" <(echo "bookworm minbase python3 python3-dnslib busybox-static v1"))
if [ ! -f "$IMAGES/python-$py_key.tar" ]; then
  # the mirror this machine's apt uses (read at run time; nothing is written down)
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$MIRROR" ] || MIRROR=$(awk '$1=="deb"{for(i=2;i<=NF;i++) if($i ~ /^[a-z]+:\/\//){print $i; exit}}' /etc/apt/sources.list)
  [ -n "$MIRROR" ] || die "no Debian mirror found in apt's sources"
  tmp=$(mktemp -d "$IMAGES/python.XXXXXX")
  log "mmdebstrap bookworm minbase + python3 (1-3 min; log $tmp/mmdebstrap.log)"
  mmdebstrap --variant=minbase --include=python3,python3-dnslib,busybox-static \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/etc/apt/sources.list' \
    bookworm "$tmp/rootfs.tar" "$MIRROR" > "$tmp/mmdebstrap.log" 2>&1 \
    || { tail -20 "$tmp/mmdebstrap.log"; die "mmdebstrap failed"; }
  python3 "$HERE/mkimage.py" "$tmp/rootfs.tar" "$tmp/out.tar" "$PY_IMAGE" --cmd '["python3"]' --strip-dev >/dev/null
  mv "$tmp/out.tar" "$IMAGES/python-$py_key.tar"
  rm -rf "$tmp"
fi
ln -sfn "python-$py_key.tar" "$IMAGES/python-oci.tar"
log "images: $IMAGES/pause-oci.tar $IMAGES/python-oci.tar"
