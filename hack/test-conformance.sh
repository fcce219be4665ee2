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
#
# Usage: hack/test-conformance.sh            (what `make test-conformance` runs)
#        BACKENDS=nftables RUN=TestConformance/UDPFlowFollowsReplacedBackend hack/test-conformance.sh
set -uo pipefail
cd "$(dirname "$0")/.."

BACKENDS="${BACKENDS:-iptables nftables}"
GO_TEST_FLAGS="${GO_TEST_FLAGS:--v}"

log() { echo "test-conformance: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "needs root (network namespaces, netfilter)"
  exit 1
fi

if [ -z "${SLUICE_BIN:-}" ] || [ -z "${SLUICE_ECHOSERVER:-}" ]; then
  make --no-print-directory build || { log "make build failed"; exit 1; }
  export SLUICE_BIN="${SLUICE_BIN:-$PWD/bin/sluice}"
  export SLUICE_ECHOSERVER="${SLUICE_ECHOSERVER:-$PWD/bin/echoserver}"
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
  # shellcheck disable=SC2086
  go test -tags conformance -count=1 -timeout 30m $GO_TEST_FLAGS "${extra[@]}" ./test/conformance \
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
