#!/usr/bin/env bash
# Builds (once) and prints the paths of the real kube-apiserver and etcd used by sluice's
# end-to-end and conformance tests and by the sandbox (test/framework/controlplane).
#
# Both are built from the Go module proxy, never downloaded as release binaries:
#   kube-apiserver from k8s.io/kubernetes@$KUBE_VERSION (cmd/kube-apiserver)
#   etcd           from go.etcd.io/etcd/server/v3@$ETCD_VERSION (the module's root is etcd's main)
#
# k8s.io/kubernetes cannot be required directly: its go.mod points every k8s.io staging
# module at ./staging/..., which is not in the module zip. A throwaway module requires it
# and replaces each staging module with its published v0.x release of the same minor.
#
# The binaries are cached outside the tracked tree ($SLUICE_CACHE, default ~/.cache/sluice;
# binaries in its bin/), keyed by version, so only the first run pays for the build: about
# 9 minutes on 2 cores with cold Go module and build caches, almost all of it kube-apiserver.
# Later runs only check that the two files exist and print their paths.
#
# Safe to run concurrently (CI jobs, parallel test packages): builds are serialised by
# flock on $SLUICE_CACHE/bin/.build.lock, each binary is built under a temporary name and
# renamed into place only after it ran --version successfully, so a reader never sees a
# half-written binary and an interrupted build leaves nothing behind.
#
# Usage: hack/control-plane.sh            build if needed, print "KUBE_APISERVER=... ETCD=..."
#        hack/control-plane.sh --env      same, one shell assignment a line (to eval)
#        hack/control-plane.sh --help
# Environment: KUBE_VERSION (default v1.37.2), ETCD_VERSION (default v3.7.3), SLUICE_CACHE.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"

log() { echo "control-plane: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  sed -n 's/^# \{0,1\}//; /^Usage:/,/^Environment:/p' "$0"
}

mode=plain
case "${1:-}" in
  "") ;;
  --env) mode=env ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; die "unknown argument: $1" ;;
esac

if [ -z "${SLUICE_CACHE:-}" ] && [ -z "${HOME:-}" ]; then
  die "neither SLUICE_CACHE nor HOME is set: cannot choose a cache directory"
fi
CACHE="${SLUICE_CACHE:-${HOME}/.cache/sluice}"
BIN="${CACHE}/bin"
apiserver="${BIN}/kube-apiserver-${KUBE_VERSION}"
etcd="${BIN}/etcd-${ETCD_VERSION}"

print_paths() {
  if [ "$mode" = env ]; then
    echo "KUBE_APISERVER=${apiserver}"
    echo "ETCD=${etcd}"
  else
    echo "KUBE_APISERVER=${apiserver} ETCD=${etcd}"
  fi
}

# Fast path, no lock: binaries only ever appear by rename, so existing means complete.
if [ -x "$apiserver" ] && [ -x "$etcd" ]; then
  print_paths
  exit 0
fi

command -v go >/dev/null || die "go is not in PATH; it is needed to build kube-apiserver ${KUBE_VERSION} and etcd ${ETCD_VERSION}"
command -v flock >/dev/null || die "flock is not in PATH (package util-linux)"

mkdir -p "$BIN" || die "cannot create the cache directory $BIN"
exec 9>"${BIN}/.build.lock"
if ! flock -n 9; then
  log "another invocation is building; waiting for ${BIN}/.build.lock"
  flock 9
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-control-plane.XXXXXX")"
cleanup() {
  rm -rf "$work"
  rm -f "${apiserver}.tmp.$$" "${etcd}.tmp.$$"
}
trap cleanup EXIT
# Turn signals into a normal exit so the EXIT trap removes the work directory.
trap 'exit 130' INT
trap 'exit 143' TERM
# Holding the lock, nobody else is building: a leftover temporary binary is from an
# invocation that was killed, and can go.
rm -f "${BIN}"/*.tmp.*

# The throwaway modules must not inherit the caller's module settings (a go.work above
# $TMPDIR, GOFLAGS=-mod=vendor or build tags meant for sluice's own tests).
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

staging_version() { # v1.37.2 -> v0.37.2
  local v="${KUBE_VERSION#v}"
  echo "v0.${v#*.}"
}

# install_checked BUILT FINAL WANT: run BUILT --version, require WANT in its output, then
# rename it to FINAL (same directory, so the rename is atomic).
install_checked() {
  local built="$1" final="$2" want="$3" out
  out="$("$built" --version 2>&1)" || die "$built --version failed: $out"
  case "$out" in
    *"$want"*) ;;
    *) die "$built --version printed '$out', expected it to mention $want" ;;
  esac
  mv -f "$built" "$final"
}

build_etcd() {
  local dir="${work}/etcd" start=$SECONDS
  log "building etcd ${ETCD_VERSION} from the Go module proxy (first run only, ~1-2 min)"
  mkdir -p "$dir"
  (
    cd "$dir"
    go mod init sluice.local/etcd-build >/dev/null 2>&1
    # The server module's root package is etcd's main; a one-line main of our own keeps
    # the throwaway module's requirements tidy-able.
    printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' > main.go
    go mod edit -require "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
    go mod tidy
    go build -trimpath -ldflags "-s -w" -o "${etcd}.tmp.$$" .
  ) || die "building etcd ${ETCD_VERSION} failed (output above)"
  install_checked "${etcd}.tmp.$$" "$etcd" "${ETCD_VERSION#v}"
  log "built $etcd in $((SECONDS - start))s"
}

build_apiserver() {
  local dir="${work}/apiserver" start=$SECONDS sv
  sv="$(staging_version)"
  log "building kube-apiserver ${KUBE_VERSION} from the Go module proxy (first run only, ~8 min on 2 cores)"
  mkdir -p "$dir"
  (
    cd "$dir"
    go mod init sluice.local/apiserver-build >/dev/null 2>&1
    # The staging module list comes from kubernetes' own go.mod replace block.
    go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" > kubernetes.json ||
      { cat kubernetes.json >&2; exit 1; }
    gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' kubernetes.json)"
    [ -f "$gomod" ] || { echo "no GoMod file in 'go mod download' output" >&2; exit 1; }
    mods="$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod")"
    [ -n "$mods" ] || { echo "no staging modules found in $gomod" >&2; exit 1; }
    args=(-require "k8s.io/kubernetes@${KUBE_VERSION}")
    for m in $mods; do args+=(-replace "${m}=${m}@${sv}"); done
    go mod edit "${args[@]}"
    printf 'package tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' > tools.go
    go mod tidy
    go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}" \
      -o "${apiserver}.tmp.$$" k8s.io/kubernetes/cmd/kube-apiserver
  ) || die "building kube-apiserver ${KUBE_VERSION} failed (output above)"
  install_checked "${apiserver}.tmp.$$" "$apiserver" "$KUBE_VERSION"
  log "built $apiserver in $((SECONDS - start))s"
}

# Re-check under the lock: a concurrent invocation may have built them while we waited.
[ -x "$etcd" ] || build_etcd
[ -x "$apiserver" ] || build_apiserver

print_paths
