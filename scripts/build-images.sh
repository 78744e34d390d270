#!/usr/bin/env bash
# Builds the operator image and the trainer image without a Docker engine (docs/images.md):
#   scripts/build-images.sh [--variant cpu|cuda] [--out DIR]          (as root; default: cpu, out/images)
# 1. a Debian bookworm minbase root filesystem with Python (mmdebstrap, from the mirror in this machine's apt
#    sources, which is not left in it), wrapped into an OCI archive by scripts/ociarchive.py;
# 2. Debian's buildah builds operator/Dockerfile and trainer_image/Dockerfile (VARIANT) on it;
# 3. DIR/grpo-operator.tar and DIR/grpo-trainer-<variant>.tar: OCI archives named as the chart's defaults, for
#    `ctr -n k8s.io images import` / `docker load`.
# Each archive is rebuilt only when a hash of its inputs (Dockerfile, locks, sources, this script, the base
# recipe) changed: a second run with nothing changed takes seconds. The build-time CA bundle (pip behind a
# TLS-intercepting proxy) and host wheel folders are read-only binds: nothing of this machine stays in an image.
# Env: MIRROR (Debian mirror), GRPO_IMAGE_ARCH (amd64|arm64, default: this machine's), KEEP_BUILD_LOGS.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VARIANT=cpu
OUT=$REPO/out/images
usage() { echo "usage: $0 [--variant cpu|cuda] [--out DIR]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) [ $# -ge 2 ] || usage; VARIANT=$2; shift 2 ;;
    --variant=*) VARIANT=${1#*=}; shift ;;
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --out=*) OUT=${1#*=}; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build-images.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
case "$VARIANT" in cpu|cuda) ;; *) echo "build-images.sh: --variant must be cpu or cuda, got '$VARIANT'" >&2; exit 2 ;; esac
T0=$(date +%s)
log() { printf '[build-images %4ds] %s\n' $(( $(date +%s) - T0 )) "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap and buildah build root filesystems here)"
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
CACHE=$OUT/.cache; LOGS=$OUT/logs
mkdir -p "$CACHE" "$LOGS"
# One build at a time per DIR (test runs of several clones share the machine's cache): the next waits.
exec 9>"$OUT/.lock"; flock 9
export DEBIAN_FRONTEND=noninteractive

# Image names: the chart's defaults (values.yaml image.repository:appVersion, trainerImage).
CHART=$REPO/charts/grpo-operator
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$CHART/Chart.yaml")
OP_REPO=$(awk '/^image:/{f=1; next} f && /^[^ ]/{f=0} f && $1=="repository:"{print $2; exit}' "$CHART/values.yaml")
TRAINER_DEFAULT=$(awk '$1=="trainerImage:"{print $2; exit}' "$CHART/values.yaml")
[ -n "$APP_VERSION" ] && [ -n "$OP_REPO" ] && [ -n "$TRAINER_DEFAULT" ] \
  || die "cannot read appVersion / image.repository / trainerImage from $CHART"
OP_IMAGE=$OP_REPO:$APP_VERSION
# The cuda image is the default trainer image; the cpu one is published as <default>-cpu and, in the local
# archive, also carries the default name so that a CPU node runs jobs without spec.image.
if [ "$VARIANT" = cuda ]; then TRAINER_IMAGE=$TRAINER_DEFAULT; else TRAINER_IMAGE=$TRAINER_DEFAULT-cpu; fi
ARCH=${GRPO_IMAGE_ARCH:-$(dpkg --print-architecture)}
# The CUDA lock downloads and installs ~10x the CPU one's bytes (nvidia-* libraries, vLLM's CUDA kernels).
BUD_TIMEOUT=1800; [ "$VARIANT" = cuda ] && BUD_TIMEOUT=5400

# --- Debian packages (once; apt-get update only when something is missing)
PKGS="mmdebstrap buildah runc debian-archive-keyring ca-certificates python3"
if [ "$(dpkg-query -W -f='${Status}\n' $PKGS 2>/dev/null | grep -c 'install ok installed')" != "$(echo $PKGS | wc -w)" ]; then
  log "installing $PKGS"
  timeout 600 apt-get update -q >"$LOGS/apt.log" 2>&1 || { tail -20 "$LOGS/apt.log"; die "apt-get update failed"; }
  timeout 900 apt-get install -y -q --no-install-recommends $PKGS >>"$LOGS/apt.log" 2>&1 \
    || { tail -20 "$LOGS/apt.log"; die "apt-get install $PKGS failed"; }
fi

# --- inputs and their hashes
# The build context holds only what the Dockerfiles COPY: files git tracks or would track (no venv, no caches).
stage() {  # stage DIR PATH... : copies those repo paths into DIR
  local dir=$1; shift
  rm -rf "$dir"; mkdir -p "$dir"
  if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard -- "$@" \
      | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
      | tar --null -T - -cf -) | tar -C "$dir" -xf -
  else
    (cd "$REPO" && tar --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' --exclude=build -cf - "$@") \
      | tar -C "$dir" -xf -
  fi
}
tree_hash() {  # tree_hash DIR EXTRA... : content hash of the staged tree plus extra strings/files
  local dir=$1; shift
  { (cd "$dir" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); printf '%s\n' "$@"; \
    sha256sum "$REPO/scripts/build-images.sh" "$REPO/scripts/ociarchive.py" | cut -d' ' -f1; } \
    | sha256sum | cut -c1-16
}

# --- the base: mmdebstrap bookworm minbase + Python (and a compiler for the trainer: Triton/inductor)
BASE_PKGS_operator="python3,python3-venv,ca-certificates"
# libnuma1: vLLM's CPU kernels (vllm/_C.so) link it.
BASE_PKGS_trainer="python3,python3-venv,python3-dev,g++,libnuma1,ca-certificates"
mirror() {
  [ -n "${MIRROR:-}" ] && { echo "$MIRROR"; return; }
  local m=""
  if grep -qs '^ID=debian' /etc/os-release; then
    m=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$m" ] || m=$(awk '$1=="deb"{for(i=2;i<=NF;i++) if($i ~ /^[a-z]+:\/\//){print $i; exit}}' \
                        /etc/apt/sources.list 2>/dev/null || true)
  fi
  echo "${m:-http://deb.debian.org/debian}"   # not Debian (e.g. Ubuntu CI runners): Debian's own mirror
}
security_mirror() {  # the host's debian-security mirror, else Debian's own
  [ -n "${SECURITY_MIRROR:-}" ] && { echo "$SECURITY_MIRROR"; return; }
  local m=""
  if grep -qs '^ID=debian' /etc/os-release; then
    m=$(awk '/^URIs:/{u=$2} /^Suites:/ && /-security/{print u; exit}' /etc/apt/sources.list.d/debian.sources \
        2>/dev/null || true)
    [ -n "$m" ] || m=$(awk '$1=="deb" && /-security/{for(i=2;i<=NF;i++) if($i ~ /^[a-z]+:\/\//){print $i; exit}}' \
                        /etc/apt/sources.list 2>/dev/null || true)
  fi
  echo "${m:-http://deb.debian.org/debian-security}"
}
base_hash() {  # base_hash KIND: the base's recipe (packages, arch, this function's and the writer's code)
  local pkgs_var=BASE_PKGS_$1
  printf '%s\n' "$1" "${!pkgs_var}" "$ARCH" "$(sha256sum "$REPO/scripts/ociarchive.py" | cut -c1-64)" \
    "$(declare -f build_base)" | sha256sum | cut -c1-16
}
build_base() {  # build_base KIND -> prints the OCI archive's path
  local kind=$1 pkgs_var=BASE_PKGS_$1
  local pkgs=${!pkgs_var} h
  h=$(base_hash "$kind")
  local archive=$CACHE/base-$kind-$ARCH-$h.tar
  if [ ! -f "$archive" ]; then
    local m sm; m=$(mirror); sm=$(security_mirror)
    # bookworm with its point-release updates and security fixes (the host's mirrors; not left in the image)
    log "base ($kind): mmdebstrap bookworm(+updates, security) minbase + $pkgs (log $LOGS/mmdebstrap-$kind.log)"
    rm -f "$CACHE/base-$kind-$ARCH-"*.tar "$CACHE/rootfs-$kind.tar"
    # The mirror and apt's lists are deleted from the image: nothing of this machine stays in it.
    timeout 900 mmdebstrap --variant=minbase --architectures="$ARCH" --include="$pkgs" \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*' \
      --customize-hook='rm -f "$1"/etc/hostname "$1"/etc/resolv.conf; : > "$1"/etc/machine-id' \
      bookworm "$CACHE/rootfs-$kind.tar" "deb $m bookworm main" "deb $m bookworm-updates main" \
      "deb $sm bookworm-security main" >"$LOGS/mmdebstrap-$kind.log" 2>&1 \
      || { tail -20 "$LOGS/mmdebstrap-$kind.log" >&2; die "mmdebstrap failed"; }
    python3 "$REPO/scripts/ociarchive.py" from-rootfs --arch "$ARCH" "$CACHE/rootfs-$kind.tar" "$archive.part" \
      "localhost/grpo-base-$kind:$h" >&2
    mv "$archive.part" "$archive"; rm -f "$CACHE/rootfs-$kind.tar"
  fi
  echo "$archive"
}

# --- buildah, in a storage of its own under DIR/.cache (nothing in the machine's container storage). It keeps
# buildah's layer cache between runs: a change to the sources rebuilds only the steps after their COPY. It is
# emptied when a lock or a base changes (one generation of the 3 GB dependency layer, not one per change).
BROOT=$CACHE/buildah
bh() { buildah --root "$BROOT/storage" --runroot "$BROOT/run" --storage-driver overlay "$@"; }
cleanup() { [ -z "${BASE_PID:-}" ] || kill "$BASE_PID" 2>/dev/null || true
  [ -d "$BROOT" ] && { bh rm --all >/dev/null 2>&1 || true; } || true; }
trap cleanup EXIT
GENERATION=$({ cat "$REPO"/trainer_image/requirements*.txt "$REPO"/trainer_image/lock-*.txt \
  "$REPO/operator/requirements.txt"; base_hash operator; base_hash trainer; } | sha256sum | cut -c1-16)
if [ -d "$BROOT" ] && [ "$(cat "$BROOT/generation" 2>/dev/null)" != "$GENERATION" ]; then
  bh rm --all >/dev/null 2>&1 || true; bh rmi --all --force >/dev/null 2>&1 || true; rm -rf "$BROOT"
fi
mkdir -p "$BROOT"; echo "$GENERATION" >"$BROOT/generation"
HOST_CA=""
for f in "${PIP_CERT:-}" /etc/ssl/certs/ca-certificates.crt; do [ -n "$f" ] && [ -f "$f" ] && { HOST_CA=$f; break; }; done
# Host folders of wheels (pip's find-links of this machine, e.g. torch's CPU wheel when its index is unreachable).
WHEELS=$(pip3 config get global.find-links 2>/dev/null || true); WHEELS=${PIP_FIND_LINKS:-$WHEELS}
WHEELS_DIR=""  # the first of them that holds wheels
for w in $WHEELS; do w=${w#file://}; ls "$w"/*.whl >/dev/null 2>&1 && { WHEELS_DIR=$w; break; }; done

inputs_hash() {  # inputs_hash NAME DOCKERFILE IMAGE BASEKIND ALIAS -- BUILDARG... : stages CONTEXT_PATHS, prints the hash
  local name=$1 dockerfile=$2 image=$3 basekind=$4 alias=$5; shift 6
  stage "$CACHE/ctx-$name" "$dockerfile" "${CONTEXT_PATHS[@]}"
  tree_hash "$CACHE/ctx-$name" "$name" "$image" "$alias" "$ARCH" "$(base_hash "$basekind")" "$@"
}
up_to_date() { [ -f "$OUT/$1.tar" ] && [ "$(cat "$OUT/$1.tar.inputs" 2>/dev/null)" = "$2" ]; }

build_one() {  # build_one NAME DOCKERFILE IMAGE BASEKIND ALIAS -- BUILDARG...
  local name=$1 dockerfile=$2 image=$3 basekind=$4 alias=$5
  local out=$OUT/$name.tar ctx=$CACHE/ctx-$name h base
  h=$(inputs_hash "$@"); shift 6
  if up_to_date "$name" "$h"; then
    log "$name: up to date ($out, inputs $h)"; rm -rf "$ctx"; return
  fi
  base=$(build_base "$basekind")
  local base_ref="localhost/grpo-base-$basekind:$(basename "$base" .tar | sed 's/.*-//')"
  log "$name: buildah pull base; bud $dockerfile (log $LOGS/$name.log)"
  bh pull -q "oci-archive:$base" >/dev/null
  # Binds go onto paths the base already has, so that no mount point is left behind in the image: the host's
  # CA bundle over the base's (for the RUN steps only; the image keeps Debian's), a wheel folder on /mnt.
  local binds=() args=()
  if [ -n "$HOST_CA" ]; then
    binds+=(-v "$HOST_CA:/etc/ssl/certs/ca-certificates.crt:ro")
    args+=(--build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
  fi
  if [ -n "$WHEELS_DIR" ]; then binds+=(-v "$WHEELS_DIR:/mnt:ro"); args+=(--build-arg PIP_FIND_LINKS=/mnt); fi
  for a in "$@"; do args+=(--build-arg "$a"); done
  timeout "$BUD_TIMEOUT" buildah --root "$BROOT/storage" --runroot "$BROOT/run" --storage-driver overlay \
    bud --network host --layers --format oci --pull=false \
    --build-arg "BASE_IMAGE=$base_ref" "${args[@]}" "${binds[@]}" \
    -f "$ctx/$dockerfile" -t "$image" "$ctx" >"$LOGS/$name.log" 2>&1 \
    || { tail -30 "$LOGS/$name.log" >&2; die "buildah bud $dockerfile failed (log $LOGS/$name.log)"; }
  rm -f "$out" "$out.inputs"
  log "$name: built; writing the OCI archive"
  bh push -q "$image" "oci-archive:$out.part:$image" >/dev/null 2>>"$LOGS/$name.log" \
    || die "buildah push $image failed (log $LOGS/$name.log)"
  python3 "$REPO/scripts/ociarchive.py" add-name "$out.part" "$image"  # also io.containerd.image.name
  [ -z "$alias" ] || python3 "$REPO/scripts/ociarchive.py" add-name "$out.part" "$alias"
  mv "$out.part" "$out"; echo "$h" >"$out.inputs"
  # The image and its base stay in this storage: removing them would remove the cached steps with them.
  rm -rf "$ctx"
  log "$name: $out ($(du -m "$out" | cut -f1) MB) = $image${alias:+ + $alias}"
}

OP_PATHS=(pyproject.toml README.md operator/requirements.txt operator/grpo_operator trainer_image/grpo_trainer)
OP=(grpo-operator operator/Dockerfile "$OP_IMAGE" operator "" --)
TR_PATHS=(trainer_image/lock-cpu.txt trainer_image/lock-cuda.txt trainer_image/vllm-dist-alias/pyproject.toml
          trainer_image/grpo_trainer)
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# torch's CPU wheel from the host's wheel folder when it holds one (its index may be unreachable from here).
[ -n "$WHEELS_DIR" ] && ls "$WHEELS_DIR"/torch-*+cpu-*.whl >/dev/null 2>&1 && TORCH_CPU_INDEX=""
ALIAS=""; [ "$VARIANT" = cpu ] && ALIAS=$TRAINER_DEFAULT
TR=("grpo-trainer-$VARIANT" trainer_image/Dockerfile "$TRAINER_IMAGE" trainer "$ALIAS" -- \
    "VARIANT=$VARIANT" "TORCH_CPU_INDEX=$TORCH_CPU_INDEX")

# The trainer's base bootstraps (network and dpkg bound) while the operator image builds.
BASE_PID=""
CONTEXT_PATHS=("${TR_PATHS[@]}")
if ! up_to_date "${TR[0]}" "$(inputs_hash "${TR[@]}")" && [ ! -f "$CACHE/base-trainer-$ARCH-$(base_hash trainer).tar" ]; then
  build_base trainer >/dev/null & BASE_PID=$!
fi
CONTEXT_PATHS=("${OP_PATHS[@]}")
build_one "${OP[@]}"
if [ -n "$BASE_PID" ]; then wait "$BASE_PID" || die "the trainer's base failed"; BASE_PID=""; fi
CONTEXT_PATHS=("${TR_PATHS[@]}")
build_one "${TR[@]}"
log "done: $(cd "$OUT" && ls -1 grpo-operator.tar "grpo-trainer-$VARIANT.tar" | tr '\n' ' ')"
