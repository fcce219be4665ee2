#!/usr/bin/env bash
# Builds (once) and prints the paths of the real kube-apiserver and etcd used by sluice's
# end-to-end and conformance tests and by the sandbox.
#
# Both are built from the Go module proxy, never downloaded as release binaries:
#   kube-apiserver from k8s.io/kubernetes@$KUBE_VERSION (cmd/kube-apiserver)
#   etcd           from go.etcd.io/etcd/server/v3@$ETCD_VERSION (the server's main package)
#
# k8s.io/kubernetes cannot be required directly: its go.mod points every k8s.io staging
# module at ./staging/..., which is not in the module zip. A throwaway module requires it
# and replaces each staging module with its published v0.x release of the same minor.
#
# The binaries are cached outside the tracked tree ($SLUICE_CACHE, default
# ~/.cache/sluice/bin), keyed by version, so only the first run pays the ~11 minute build.
#
# Usage: hack/control-plane.sh            build if needed, print "KUBE_APISERVER=... ETCD=..."
#        hack/control-plane.sh --env      same, as shell assignments to eval
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"
CACHE="${SLUICE_CACHE:-${HOME}/.cache/sluice}"
BIN="${CACHE}/bin"
apiserver="${BIN}/kube-apiserver-${KUBE_VERSION}"
etcd="${BIN}/etcd-${ETCD_VERSION}"

log() { echo "control-plane: $*" >&2; }

staging_version() { # v1.37.2 -> v0.37.2
  local v="${KUBE_VERSION#v}"
  echo "v0.${v#*.}"
}

build_apiserver() {
  local work; work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  log "building kube-apiserver ${KUBE_VERSION} from the Go module proxy (first run only, ~11 min on 2 cores)"
  local sv; sv="$(staging_version)"
  (
    cd "$work"
    go mod init sluice.local/apiserver-build >/dev/null 2>&1
    # The staging module list comes from kubernetes' own go.mod replace block.
    local gomod; gomod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    local mods; mods="$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod")"
    [ -n "$mods" ] || { log "no staging modules found in $gomod"; exit 1; }
    local args=(-require "k8s.io/kubernetes@${KUBE_VERSION}")
    for m in $mods; do args+=(-replace "${m}=${m}@${sv}"); done
    go mod edit "${args[@]}"
    printf 'package tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' > tools.go
    go mod tidy >/dev/null
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}" \
      -o "${apiserver}.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  )
  mv "${apiserver}.tmp" "${apiserver}"
}

build_etcd() {
  local work; work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  log "building etcd ${ETCD_VERSION} from the Go module proxy (first run only)"
  (
    cd "$work"
    go mod init sluice.local/etcd-build >/dev/null 2>&1
    go mod edit -require "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
    printf 'package tools\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n' > tools.go
    go mod tidy >/dev/null
    # etcd's main package lives in the server module's root since v3.6? No: build etcdmain via a tiny main.
    rm tools.go
    printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' > main.go
    go mod tidy >/dev/null
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${etcd}.tmp" .
  )
  mv "${etcd}.tmp" "${etcd}"
}

mkdir -p "$BIN"
[ -x "$etcd" ] || build_etcd
[ -x "$apiserver" ] || build_apiserver

if [ "${1:-}" = "--env" ]; then
  echo "KUBE_APISERVER=${apiserver}"
  echo "ETCD=${etcd}"
else
  echo "KUBE_APISERVER=${apiserver} ETCD=${etcd}"
fi
