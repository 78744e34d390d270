#!/usr/bin/env bash
# Build the control-plane binaries the real-apiserver tests need, from Debian sources
# (no release binaries can be downloaded on these machines; Debian ships the sources).  Needs root and apt (Debian bookworm).
#
#   kube-apiserver, kube-controller-manager  v1.20.2   Debian bookworm source package `kubernetes`
#                                                       (1.20.5+really1.20.2-1.1+deb12u1), Go 1.19
#   kubelet, kube-scheduler, kube-proxy      v1.20.2   the same sources (--with-node: the node tier; static,
#                                                       CGO_ENABLED=0, ~20 min on 2 cores for all five)
#   apiextensions-apiserver                  v0.36.x   Debian sid `golang-k8s-apiextensions-apiserver-dev`,
#                                                       built in a debootstrap'd sid chroot (--with-apiextensions)
#
# Results are cached under $CACHE (default ~/.cache/grpo-operator) keyed by the source version, and
# copied into $DEST (default <repo>/.tools/bin).  Re-running with a warm cache only copies.
#
# usage: scripts/build-kube-binaries.sh [--dest DIR] [--with-node] [--with-apiextensions] [--only-apiextensions]
#                                        [--keep-build] [--jobs N] [--prepare-only]
#   --prepare-only: download, unpack, patch and swap reflect2, then stop before `make` (a quick check)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${DEST:-$REPO/.tools/bin}
CACHE=${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo-operator}
WITH_APIEXT=0
BUILD_KUBE=1
KEEP_BUILD=0
PREPARE_ONLY=0
KUBE_BINS=(kube-apiserver kube-controller-manager)

while [ $# -gt 0 ]; do
  case "$1" in
    --dest) DEST=$2; shift 2 ;;
    --with-node) KUBE_BINS+=(kubelet kube-scheduler kube-proxy); shift ;;
    --with-apiextensions) WITH_APIEXT=1; shift ;;
    --only-apiextensions) WITH_APIEXT=1; BUILD_KUBE=0; shift ;;
    --keep-build) KEEP_BUILD=1; shift ;;
    --prepare-only) PREPARE_ONLY=1; shift ;;
    --jobs) export GOMAXPROCS=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

log() { printf '[build-kube-binaries] %s\n' "$*" >&2; }
export DEBIAN_FRONTEND=noninteractive
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo

mkdir -p "$CACHE" "$DEST"

# The machine's own Debian mirror: deb822 sources first, then a classic sources.list.
mirror_uri() {
  local f=/etc/apt/sources.list.d/debian.sources
  if [ -f "$f" ]; then awk '/^URIs:/{print $2; exit}' "$f"; return; fi
  awk '$1=="deb"{for(i=2;i<=NF;i++) if($i ~ /^[a-z]+:\/\//){print $i; exit}}' /etc/apt/sources.list
}

apt_install() {  # apt-get install; `apt-get update` only when a package is unknown or lists are stale
  local updated=0
  if ! apt-cache show "$@" >/dev/null 2>&1; then $SUDO apt-get update -q; updated=1; fi
  if ! $SUDO apt-get install -y -q --no-install-recommends "$@"; then
    [ $updated = 1 ] && return 1
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "$@"
  fi
}

# ---------------------------------------------------------------- kube-apiserver + controller-manager
build_kube() {
  local apt_dir=$CACHE/apt-src
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts" "$apt_dir/dl"
  : > "$apt_dir/empty.list"
  # deb-src only in a private apt state dir: the machine's apt configuration is not touched.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$apt_dir/parts/src.sources"
  else
    echo "deb-src $(mirror_uri) bookworm main" > "$apt_dir/parts/src.list"
  fi
  local APTO=(-o "Dir::Etc::SourceList=$apt_dir/empty.list" -o "Dir::Etc::SourceParts=$apt_dir/parts"
              -o "Dir::State::Lists=$apt_dir/lists")
  log "apt-get update (private deb-src state in $apt_dir)"
  $SUDO apt-get "${APTO[@]}" update -q
  local version
  version=$(apt-cache "${APTO[@]}" showsrc kubernetes | awk '/^Version:/{print $2}' | sort -V | tail -1)
  [ -n "$version" ] || { log "no kubernetes source package found"; exit 1; }
  local out=$CACHE/kube-$version
  local have=1
  for b in "${KUBE_BINS[@]}"; do [ -x "$out/$b" ] || have=0; done
  if [ $have = 1 ]; then
    log "cached: $out"
  else
    log "source package kubernetes $version"
    (cd "$apt_dir/dl" && apt-get "${APTO[@]}" source --download-only "kubernetes=$version")
    apt_install golang-go etcd-server golang-github-modern-go-reflect2-dev rsync
    local upstream=${version%-*}                 # 1.20.5+really1.20.2
    local orig=$apt_dir/dl/kubernetes_${upstream#*:}.orig.tar.gz
    local debtar
    debtar=$(ls "$apt_dir"/dl/kubernetes_"${version#*:}".debian.tar.* | head -1)
    local build=$CACHE/build-$version
    rm -rf "$build"; mkdir -p "$build"
    log "unpacking $(basename "$orig")"
    tar -xzf "$orig" -C "$build" --strip-components=1
    tar -xf "$debtar" -C "$build"
    # Debian's quilt patches (kubectl printing + CVE-2021-25743), as dpkg-source would apply them.
    if [ -f "$build/debian/patches/series" ]; then
      while read -r p; do
        case "$p" in ''|\#*) continue ;; esac
        log "patch $p"; patch -d "$build" -p1 -s < "$build/debian/patches/$p"
      done < "$build/debian/patches/series"
    fi
    # vendored reflect2 1.0.1 + Go >= 1.18 segfaults in json-iterator at the first custom-resource
    # create: use Debian's reflect2 1.0.2 sources instead.
    local r2=/usr/share/gocode/src/github.com/modern-go/reflect2
    log "replacing vendor/github.com/modern-go/reflect2 with Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
    find "$build/vendor/github.com/modern-go/reflect2" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
    cp "$r2"/*.go "$build/vendor/github.com/modern-go/reflect2/"
    cp "$r2"/*.s "$build/vendor/github.com/modern-go/reflect2/" 2>/dev/null || true
    # GOPATH layout as debian/rules does.
    mkdir -p "$build/.go/src/k8s.io"
    ln -sfn ../../.. "$build/.go/src/k8s.io/kubernetes"
    if [ $PREPARE_ONLY = 1 ]; then log "prepared $build (--prepare-only: not building)"; return 0; fi
    log "make WHAT='${KUBE_BINS[*]/#/cmd/}' (first build ~8 min on 2 cores; GOCACHE=$CACHE/gocache)"
    (
      cd "$build/.go/src/k8s.io/kubernetes"
      export GOPATH=$build/.go CGO_ENABLED=0 GOCACHE=$CACHE/gocache HOME=${HOME:-/root}
      export PATH=/usr/lib/go/bin:$PATH
      make WHAT="${KUBE_BINS[*]/#/cmd/}"
    )
    mkdir -p "$out.partial"
    for b in "${KUBE_BINS[@]}"; do cp "$build/_output/bin/$b" "$out.partial/$b"; done
    rm -rf "$out"; mv "$out.partial" "$out"
    [ $KEEP_BUILD = 1 ] || rm -rf "$build"
  fi
  for b in "${KUBE_BINS[@]}"; do install -m 0755 "$out/$b" "$DEST/$b"; done
  log "$("$DEST/kube-apiserver" --version): ${KUBE_BINS[*]} -> $DEST"
}

# ---------------------------------------------------------------- apiextensions-apiserver (CEL)
build_apiext() {
  local out=$CACHE/apiextensions-apiserver
  if [ -x "$out/apiextensions-apiserver" ]; then
    log "cached: $out/apiextensions-apiserver"
  else
    apt_install debootstrap ca-certificates
    CHROOT=$CACHE/sid-chroot   # global: the EXIT trap needs it after this function returns
    local root=$CHROOT
    local mirror; mirror=$(mirror_uri)
    $SUDO rm -rf "$root"
    log "debootstrap --variant=minbase sid $root $mirror (~40 s)"
    $SUDO debootstrap --variant=minbase sid "$root" "$mirror"
    cleanup_chroot() {
      $SUDO umount "$CHROOT/proc" 2>/dev/null || true
      [ $KEEP_BUILD = 1 ] || $SUDO rm -rf "$CHROOT"       # ~4.8 GB
    }
    trap cleanup_chroot EXIT
    $SUDO mount -t proc proc "$root/proc" || true
    log "installing golang-go golang-k8s-apiextensions-apiserver-dev in the chroot (~2 min)"
    $SUDO chroot "$root" env DEBIAN_FRONTEND=noninteractive \
      apt-get -o Acquire::Check-Valid-Until=false update -q
    $SUDO chroot "$root" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends golang-go golang-k8s-apiextensions-apiserver-dev ca-certificates
    local pkgver
    pkgver=$($SUDO chroot "$root" dpkg-query -W -f='${Version}' golang-k8s-apiextensions-apiserver-dev)
    log "go build k8s.io/apiextensions-apiserver ($pkgver, ~3 min)"
    $SUDO chroot "$root" env GO111MODULE=off GOPATH=/usr/share/gocode CGO_ENABLED=0 HOME=/root \
      GOCACHE=/root/.cache/go-build sh -c 'cd /root && go build -o /root/apiextensions-apiserver k8s.io/apiextensions-apiserver'
    mkdir -p "$out"
    cp "$root/root/apiextensions-apiserver" "$out/apiextensions-apiserver"
    echo "$pkgver" > "$out/VERSION"
    cleanup_chroot; trap - EXIT
  fi
  install -m 0755 "$out/apiextensions-apiserver" "$DEST/apiextensions-apiserver"
  log "apiextensions-apiserver $(cat "$out/VERSION" 2>/dev/null) -> $DEST"
}

[ $BUILD_KUBE = 1 ] && build_kube
[ $WITH_APIEXT = 1 ] && build_apiext
exit 0
