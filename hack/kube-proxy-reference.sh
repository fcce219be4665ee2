#!/usr/bin/env bash
# Builds (once) and prints the path of upstream kube-proxy, the reference the conformance
# suite compares sluice with (test/conformance/README.md, "Upstream is the reference").
#
# Built from the Go module proxy like hack/control-plane.sh builds kube-apiserver, never
# downloaded as a release binary: k8s.io/kubernetes@$KUBE_VERSION's cmd/kube-proxy, in a
# throwaway module that replaces every staging module with its published v0.x release.
# Static (CGO_ENABLED=0), so the IPVS VM runs it as it is. Cached as
# $SLUICE_CACHE/bin/kube-proxy-$KUBE_VERSION (default ~/.cache/sluice); later runs only
# print the path. About 3 minutes on 2 cores once kube-apiserver's build has filled the Go
# build cache, 8 without.
#
# Safe to run concurrently: builds are serialised by flock, the binary is built under a
# temporary name and renamed into place once its --version names $KUBE_VERSION.
#
# Usage: hack/kube-proxy-reference.sh      build if needed, print the path
# Environment: KUBE_VERSION (default v1.37.2), SLUICE_CACHE.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
log() { echo "kube-proxy-reference: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ -n "${SLUICE_CACHE:-}${HOME:-}" ] || die "neither SLUICE_CACHE nor HOME is set: cannot choose a cache directory"
BIN="${SLUICE_CACHE:-${HOME}/.cache/sluice}/bin"
bin="${BIN}/kube-proxy-${KUBE_VERSION}"

# Fast path, no lock: the binary only ever appears by rename, so existing means complete.
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || die "go is not in PATH; it is needed to build kube-proxy ${KUBE_VERSION}"
command -v flock >/dev/null || die "flock is not in PATH (package util-linux)"
mkdir -p "$BIN"
exec 9>"${BIN}/.kube-proxy.lock"
if ! flock -n 9; then
  log "another invocation is building; waiting for ${BIN}/.kube-proxy.lock"
  flock 9
fi
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-kube-proxy.XXXXXX")"
trap 'rm -rf "$work"; rm -f "${bin}.tmp.$$"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

start=$SECONDS
log "building kube-proxy ${KUBE_VERSION} from the Go module proxy (first run only)"
(
  cd "$work"
  go mod init sluice.local/kube-proxy-reference >/dev/null 2>&1
  go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" > kubernetes.json ||
    { cat kubernetes.json >&2; exit 1; }
  gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' kubernetes.json)"
  [ -f "$gomod" ] || { echo "no GoMod file in 'go mod download' output" >&2; exit 1; }
  v="${KUBE_VERSION#v}"
  sv="v0.${v#*.}" # v1.37.2 -> v0.37.2: each staging module's published release
  args=(-require "k8s.io/kubernetes@${KUBE_VERSION}")
  for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod"); do
    args+=(-replace "${m}=${m}@${sv}")
  done
  go mod edit "${args[@]}"
  printf 'package tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-proxy"\n' > tools.go
  go mod tidy
  go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}" \
    -o "${bin}.tmp.$$" k8s.io/kubernetes/cmd/kube-proxy
) >&2 || die "building kube-proxy ${KUBE_VERSION} failed (output above)"
out="$("${bin}.tmp.$$" --version 2>&1)" || die "kube-proxy --version failed: $out"
[[ "$out" == *"$KUBE_VERSION"* ]] || die "kube-proxy --version printed '$out', expected ${KUBE_VERSION}"
mv -f "${bin}.tmp.$$" "$bin"
log "built $bin in $((SECONDS - start))s"
echo "$bin"
