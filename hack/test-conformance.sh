#!/usr/bin/env bash
# Runs the real-packet conformance suite (test/conformance) against sluice and, as the
# reference, upstream kube-proxy, in every backend given, then compares their outcomes
# (go run ./test/conformance/checkresults): a difference not declared in
# test/conformance/differences.yaml fails, and so does a capability table
# (test/conformance/capabilities.json) that is not what sluice's runs show. Needs root: it
# builds network namespaces (in a private namespace of its own, so the machine's namespace
# is never touched).
#
# Every proxy in every backend runs in one test process, each in a cluster of its own (its
# own netns topology, all sharing one control plane), and every case runs in every family
# variant (IPv4, IPv6, RequireDualStack), in parallel.
#
# Environment:
#   BACKENDS        backends to run (default "iptables nftables"; "ipvs" needs a kernel with
#                   IPVS, see hack/ipvs-vm.sh)
#   REFERENCE=0     run sluice only, without upstream kube-proxy and without the comparison
#                   (default 1: kube-proxy $KUBE_VERSION is built once from the Go module proxy
#                   by hack/kube-proxy-reference.sh and cached in $SLUICE_CACHE/bin)
#   RUN             only the cases matching this -run pattern, e.g. RUN='TestConformance/Hairpin'
#                   or RUN='TestConformance/Hairpin/IPv6'
#   ARTIFACTS       keep every process log (proxies, echo servers, apiserver, etcd) and the
#                   results under this directory; without it, logs are kept only for a failing
#                   run (the test log names the directory)
#   SLUICE_BIN, SLUICE_ECHOSERVER, KUBE_PROXY_BIN
#                   prebuilt binaries; default: `make build`, bin/ and hack/kube-proxy-reference.sh
#   PARALLEL        how many cases run at once (default 24: they mostly wait for packets)
#   GO_TEST_FLAGS   extra `go test` flags (default "-v")
#   SLUICE_REQUIRE  features whose absence fails a case instead of skipping it (test/require;
#                   default: hack/lib/tier.sh's list for the host)
#
# The run goes through hack/testcount: fewer passing tests than CONFORMANCE_FLOOR (below)
# fail it, unless RUN narrows the run.
#
# Usage: hack/test-conformance.sh            (what `make test-conformance` runs)
#        BACKENDS=nftables RUN=TestConformance/UDPFlowFollowsReplacedBackend hack/test-conformance.sh
#        REFERENCE=0 BACKENDS=iptables hack/test-conformance.sh
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib/tier.sh
source hack/lib/tier.sh

BACKENDS="${BACKENDS:-iptables nftables}"
REFERENCE="${REFERENCE:-1}"
PARALLEL="${PARALLEL:-24}"
GO_TEST_FLAGS="${GO_TEST_FLAGS:--v}"

# The floor: tests (cases and their subtests) that pass, at least, in a whole run (RUN
# unset); raise it with the cases. Every proxy runs in the same tests (a test passes when
# every proxy passed it), so the count does not depend on BACKENDS. Counted on the CI host:
# TestConformance, its 4 disruptive cases, its 28 other cases and their 83 family variants,
# less SCTPClusterIPAndNodePort's 3 (no SCTP on the host; it runs in the IPVS VM). The
# sluice-only TrafficCounters needs a sluice cluster: BACKENDS must include iptables or
# nftables (the default has both).
CONFORMANCE_FLOOR=113

log() { echo "test-conformance: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "needs root (network namespaces, netfilter)"
  exit 1
fi
tier_require

if [ -z "${SLUICE_BIN:-}" ]; then
  make --no-print-directory build || { log "make build failed"; exit 1; }
  export SLUICE_BIN="$PWD/bin/sluice"
  export SLUICE_ECHOSERVER="${SLUICE_ECHOSERVER:-$PWD/bin/echoserver}"
elif [ -z "${SLUICE_ECHOSERVER:-}" ]; then
  CGO_ENABLED=0 go build -trimpath -o bin/echoserver ./test/echoserver || { log "building the echo server failed"; exit 1; }
  export SLUICE_ECHOSERVER="$PWD/bin/echoserver"
fi
if [ "$REFERENCE" = 1 ] && [ -z "${KUBE_PROXY_BIN:-}" ]; then
  KUBE_PROXY_BIN="$(hack/kube-proxy-reference.sh)" || { log "building upstream kube-proxy failed"; exit 1; }
  export KUBE_PROXY_BIN
fi
cp_env="$(hack/control-plane.sh --env)" || { log "hack/control-plane.sh failed"; exit 1; }
eval "$cp_env"
export KUBE_APISERVER ETCD

proxies=()
for backend in $BACKENDS; do
  proxies+=("sluice/${backend}")
  [ "$REFERENCE" = 1 ] && proxies+=("kube-proxy/${backend}")
done
proxies_csv="$(IFS=,; echo "${proxies[*]}")"

if [ -n "${ARTIFACTS:-}" ]; then
  export SLUICE_TEST_ARTIFACTS="${ARTIFACTS}"
  results="${ARTIFACTS}/results"
else
  results="$(mktemp -d "${TMPDIR:-/tmp}/sluice-conformance-results.XXXXXX")"
fi
rm -rf "$results" && mkdir -p "$results"

extra=()
[ -n "${RUN:-}" ] && extra+=(-run "$RUN")

log "=== ${proxies_csv}"
out="$(mktemp)"
start=$(date +%s)
floor="$CONFORMANCE_FLOOR"
[ -z "${RUN:-}" ] || floor=0
# shellcheck disable=SC2086
counted "conformance" "$floor" -v -- go test -json -tags conformance -count=1 -timeout 45m $GO_TEST_FLAGS "${extra[@]}" ./test/conformance \
  -args -proxies="$proxies_csv" -results="$results" -test.parallel="$PARALLEL" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
took=$(( $(date +%s) - start ))
grep -E '^\s*--- (FAIL|SKIP): TestConformance/' "$out" | sed 's/^\s*/test-conformance: /' >&2
# What each failing check saw, here at the end: the test's own log puts it before pages of
# process logs, which a CI log's tail cuts off.
grep -E '^\s*check_test\.go:[0-9]+: \[[^]]+\] .*, want ' "$out" | cut -c1-700 | sed 's/^\s*/test-conformance: failed check: /' >&2
p=$(grep -cE '^\s*--- PASS: TestConformance/[^/ ]+/[^/ ]+ ' "$out")
f=$(grep -cE '^\s*--- FAIL: TestConformance/[^/ ]+/[^/ ]+ ' "$out")
s=$(grep -cE '^\s*--- SKIP: TestConformance/[^/ ]+/[^/ ]+ ' "$out")
# Failed cases, counting those without family variants (the disruptive ones).
fc=$(grep -cE '^\s*--- FAIL: TestConformance/[^/ ]+ ' "$out")
rm -f "$out"

check_rc=0
if ls "$results"/*.json >/dev/null 2>&1; then
  check_flags=()
  [ "$REFERENCE" = 1 ] || check_flags+=(-reference=false)
  go run ./test/conformance/checkresults "${check_flags[@]}" "$results" || check_rc=1
else
  log "the suite wrote no results to ${results}"
  check_rc=1
fi

log "summary: ${proxies_csv}: ${p} case runs passed, ${f} failed, ${s} skipped (every proxy in every one); ${fc} case(s) failed; ${took}s; results in ${results}"
[ "$rc" = 0 ] && [ "$check_rc" = 0 ]
