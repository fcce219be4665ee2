#!/usr/bin/env bash
# Runs sluice's benchmarks (what `make bench` runs, after `make build`):
#
#   1. the backends' Go benchmarks against the real kernel:
#        go test -tags kernel -run '^$' -bench . ./pkg/dataplane/...
#      (each package's test binary re-executes itself in a private network namespace);
#   2. hack/scale: sluice against upstream kube-proxy end to end, on one control plane and
#      one dataset, every figure of issue 14 in one run: nftables at 100 / 1 000 / 10 000 /
#      50 000 Services x 10 endpoints (cold start with its API part apart, endpoint
#      changes, peak RSS over two periodic resyncs), the iptables flavours at 10 000 with
#      the iptables-restore floor, and the churn runs at 10 000 (20 and 100 changes/s).
#      About 2 h 30 min on 2 cores; docs/benchmarks.md says how long each part takes.
#
# Needs root. Not part of `make test`. Upstream kube-proxy $KUBE_VERSION is built once from
# the Go module proxy by hack/kube-proxy-reference.sh (as for the conformance suite), and cached in
# $SLUICE_CACHE/bin (default ~/.cache/sluice/bin), so both are measured on this machine.
#
# Environment:
#   QUICK=1          hack/scale at 100 and 1 000 Services, a short churn run at 1 000, no
#                    iptables runs and no resync wait (checks the harness, a few minutes)
#   SCALE_ARGS       more hack/scale flags, e.g. "-modes nftables -repeat 3" (go run ./hack/scale -h)
#   SKIP_GO_BENCH=1  skip the Go benchmarks;  SKIP_SCALE=1  skip hack/scale
#   BENCH            -bench pattern of the Go benchmarks (default .)
#   BENCHTIME        their -benchtime (default 1x: one iteration at 10 000 Services takes seconds)
#   BENCH_PKGS       their packages (default ./pkg/dataplane/...)
#   OUT              output directory (default _output/bench/<time>): go-bench.txt, scale/
#   SLUICE_BIN, SLUICE_ECHOSERVER   binaries under test (default bin/sluice, bin/echoserver)
#   KUBE_PROXY       upstream kube-proxy to compare with (default: the cached build)
#
# Usage: hack/bench.sh                 (what `make bench` runs)
#        SKIP_GO_BENCH=1 hack/bench.sh (only hack/scale: the figures of docs/benchmarks.md)
#        QUICK=1 SKIP_GO_BENCH=1 hack/bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."

log() { echo "bench: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "needs root (network namespaces, netfilter)"
  exit 1
fi

OUT="${OUT:-_output/bench/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT" || exit 1

failed=0

if [ "${SKIP_GO_BENCH:-}" != 1 ]; then
  log "=== Go benchmarks of the backends (${BENCH_PKGS:-./pkg/dataplane/...}), output in $OUT/go-bench.txt"
  # shellcheck disable=SC2086
  go test -tags kernel -run '^$' -bench "${BENCH:-.}" -benchtime "${BENCHTIME:-1x}" -benchmem -timeout 2h \
    ${BENCH_PKGS:-./pkg/dataplane/...} 2>&1 | tee "$OUT/go-bench.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { log "Go benchmarks failed"; failed=1; }
fi

if [ "${SKIP_SCALE:-}" != 1 ]; then
  if [ -z "${KUBE_PROXY:-}" ]; then
    KUBE_PROXY="$(hack/kube-proxy-reference.sh)" || { log "building upstream kube-proxy failed"; exit 1; }
  fi
  export KUBE_PROXY
  export SLUICE_BIN="${SLUICE_BIN:-$PWD/bin/sluice}" SLUICE_ECHOSERVER="${SLUICE_ECHOSERVER:-$PWD/bin/echoserver}"
  for b in "$SLUICE_BIN" "$SLUICE_ECHOSERVER"; do
    [ -x "$b" ] || { log "$b is missing: run make build (or make bench)"; exit 1; }
  done
  args=(-out "$OUT/scale")
  if [ "${QUICK:-}" = 1 ]; then
    args+=(-sizes 100,1000 -iptables-sizes '' -churn-size 1000 -churn-probes 3 -churn-flips 5 -churn-burst 200 -resyncs 0)
  fi
  log "=== hack/scale ${args[*]} ${SCALE_ARGS:-}"
  # shellcheck disable=SC2086
  # Built first so that the run's time is the benchmark's, and its output says where it went.
  go build -o "$OUT/scale.bin" ./hack/scale || { log "building hack/scale failed"; exit 1; }
  "$OUT/scale.bin" "${args[@]}" ${SCALE_ARGS:-} 2>&1 | tee "$OUT/scale.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { log "hack/scale failed"; failed=1; }
fi

log "results in $OUT"
exit "$failed"
