#!/usr/bin/env bash
# Runs the real-packet conformance suite (test/conformance) once per backend and reports
# per backend. Needs root: it builds network namespaces (in a private namespace of its own,
# so the machine's namespace is never touched).
#
# Environment:
#   BACKENDS        backends to run, in order (default "iptables nftables"; "ipvs" needs a
#                   kernel with IPVS, see hack/ipvs-vm.sh)
#   RUN             only the cases matching this -run pattern, e.g. RUN='TestConformance/Hairpin'
#   DUALSTACK=1     also exercise IPv6 (dual-stack Services, IPv6 addressing everywhere)
#   ARTIFACTS       keep every process log (sluice, echo servers, apiserver, etcd) under this
#                   directory; without it, logs are kept only for a failing run (the test
#                   log names the directory)
#   SLUICE_BIN, SLUICE_ECHOSERVER
#                   prebuilt binaries; default: `make build` and bin/
#   GO_TEST_FLAGS   extra `go test` flags (default "-v")
#   SLUICE_REQUIRE  features whose absence fails a case instead of skipping it (test/require;
#                   default: hack/lib/tier.sh's list for the host)
#   REFERENCE=1     run the suite against upstream kube-proxy $KUBE_VERSION instead of sluice,
#                   to check the suite itself: upstream's behaviour is our contract, so every
#                   case must pass against it. kube-proxy is built once from the Go module
#                   proxy, like hack/control-plane.sh builds kube-apiserver, and cached in
#                   $SLUICE_CACHE/bin (a few minutes the first time).
#
# Each backend's run goes through hack/testcount: fewer passing tests than the backend's
# CONFORMANCE_FLOOR (below) fail it, unless RUN narrows the run.
#
# Usage: hack/test-conformance.sh            (what `make test-conformance` runs)
#        BACKENDS=nftables RUN=TestConformance/UDPFlowFollowsReplacedBackend hack/test-conformance.sh
#        REFERENCE=1 hack/test-conformance.sh
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib/tier.sh
source hack/lib/tier.sh

BACKENDS="${BACKENDS:-iptables nftables}"
GO_TEST_FLAGS="${GO_TEST_FLAGS:--v}"

# The floors: tests (cases and their subtests) that pass per backend, at least, in a whole
# run (RUN unset); raise them with the cases. Counted on the CI host: TestConformance and its
# 25 cases, SCTPClusterIPAndNodePort skipped (no SCTP; it runs in the IPVS VM, where ipvs
# passes all 26).
declare -A CONFORMANCE_FLOOR=([iptables]=26 [nftables]=26 [ipvs]=27)

log() { echo "test-conformance: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "needs root (network namespaces, netfilter)"
  exit 1
fi
tier_require

# build_reference_kube_proxy builds upstream kube-proxy (cached) and prints its path.
build_reference_kube_proxy() {
  local version="${KUBE_VERSION:-v1.37.2}"
  local bin="${SLUICE_CACHE:-${HOME}/.cache/sluice}/bin/kube-proxy-${version}"
  if [ ! -x "$bin" ]; then
    log "building upstream kube-proxy ${version} from the Go module proxy (first run only)"
    local work; work="$(mktemp -d)"
    (
      set -e
      cd "$work"
      go mod init sluice.local/kube-proxy-reference >/dev/null 2>&1
      local gomod; gomod="$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
      # Each staging module is replaced by its published v0.x release of the same minor.
      local sv="v0.${version#v1.}" args=(-require "k8s.io/kubernetes@${version}")
      for m in $(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod"); do
        args+=(-replace "${m}=${m}@${sv}")
      done
      go mod edit "${args[@]}"
      printf 'package tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-proxy"\n' > tools.go
      go mod tidy >/dev/null
      mkdir -p "$(dirname "$bin")"
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${bin}.tmp" k8s.io/kubernetes/cmd/kube-proxy
      mv "${bin}.tmp" "$bin"
    ) >&2 || { rm -rf "$work"; return 1; }
    rm -rf "$work"
  fi
  echo "$bin"
}

if [ "${REFERENCE:-}" = 1 ]; then
  SLUICE_BIN="$(build_reference_kube_proxy)" || { log "building kube-proxy failed"; exit 1; }
  export SLUICE_BIN
  log "reference run: the suite against upstream ${SLUICE_BIN}"
fi

if [ -z "${SLUICE_BIN:-}" ]; then
  make --no-print-directory build || { log "make build failed"; exit 1; }
  export SLUICE_BIN="$PWD/bin/sluice"
  export SLUICE_ECHOSERVER="${SLUICE_ECHOSERVER:-$PWD/bin/echoserver}"
elif [ -z "${SLUICE_ECHOSERVER:-}" ]; then
  CGO_ENABLED=0 go build -trimpath -o bin/echoserver ./test/echoserver || { log "building the echo server failed"; exit 1; }
  export SLUICE_ECHOSERVER="$PWD/bin/echoserver"
fi
cp_env="$(hack/control-plane.sh --env)" || { log "hack/control-plane.sh failed"; exit 1; }
eval "$cp_env"
export KUBE_APISERVER ETCD

extra=()
[ -n "${RUN:-}" ] && extra+=(-run "$RUN")
args=()
[ "${DUALSTACK:-}" = 1 ] && args+=(-dualstack)

declare -A status counts took
failed=0
for backend in $BACKENDS; do
  log "=== backend ${backend}"
  out="$(mktemp)"
  if [ -n "${ARTIFACTS:-}" ]; then
    export SLUICE_TEST_ARTIFACTS="${ARTIFACTS}/${backend}"
    mkdir -p "$SLUICE_TEST_ARTIFACTS"
  fi
  start=$(date +%s)
  floor="${CONFORMANCE_FLOOR[$backend]:-0}"
  [ -z "${RUN:-}" ] || floor=0
  # shellcheck disable=SC2086
  counted "conformance ${backend}" "$floor" -v -- go test -json -tags conformance -count=1 -timeout 30m $GO_TEST_FLAGS "${extra[@]}" ./test/conformance \
    -args -backend="$backend" "${args[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  took[$backend]=$(( $(date +%s) - start ))
  p=$(grep -cE '^\s*--- PASS: TestConformance/' "$out")
  f=$(grep -cE '^\s*--- FAIL: TestConformance/' "$out")
  s=$(grep -cE '^\s*--- SKIP: TestConformance/' "$out")
  counts[$backend]="${p} passed, ${f} failed, ${s} skipped"
  if [ "$rc" = 0 ]; then status[$backend]=ok; else status[$backend]=FAIL; failed=1; fi
  grep -E '^\s*--- (FAIL|SKIP): TestConformance/' "$out" | sed "s/^/test-conformance: ${backend}: /" >&2
  rm -f "$out"
done

log "summary:"
for backend in $BACKENDS; do
  printf 'test-conformance: %-9s %-4s %s (%ss)\n' "$backend" "${status[$backend]}" "${counts[$backend]}" "${took[$backend]}" >&2
done
exit "$failed"
