#!/usr/bin/env bash
# Runs sluice's end-to-end tests (test/e2e, build tag e2e) against a real etcd and
# kube-apiserver started by test/framework/controlplane.
#
#   1. Unless $KUBE_APISERVER and $ETCD are set, hack/control-plane.sh builds the two
#      binaries if they are not cached yet (about 9 minutes the first time, then instant)
#      and their paths are exported as KUBE_APISERVER and ETCD, so no test has to run the
#      script again.
#   2. bin/sluice (and bin/echoserver) are built with `make build`, unless make is already
#      running us (make test-e2e depends on build), $SLUICE_BIN is set, or the Makefile has
#      no build target. Their paths are exported as SLUICE_BIN and SLUICE_ECHOSERVER, the
#      names the conformance suite uses too.
#   3. bin/sluice-race, sluice built with the race detector (cgo), is built and exported as
#      SLUICE_E2E_BIN: test/e2e runs it for every sluice process, and fails a test whose
#      sluice reported a data race.
#   4. go test -tags e2e -count=1 ./test/e2e/... ./test/deploy/... ./test/sandbox/...
#      ./test/rollout/... runs with a timeout of $E2E_TIMEOUT (default 20m), through
#      hack/testcount (printing what go test -v would): the tier fails when fewer than
#      E2E_FLOOR tests passed. The tests log their control plane's start-up time. test/deploy
#      applies deploy/'s manifests to the real API server; test/sandbox runs `make demo`'s
#      sandbox (hack/demo.sh) and checks it leaves nothing; test/rollout runs sluice as a
#      process in a netns node (root).
#
# Usage: hack/test-e2e.sh [go test flags, e.g. -run TestControlPlane]
# Environment: E2E_TIMEOUT, GOTESTFLAGS (extra go test flags), SLUICE_BIN,
# SLUICE_ECHOSERVER, SLUICE_E2E_BIN, SLUICE_REQUIRE (hack/lib/tier.sh), SLUICE_CACHE,
# KUBE_VERSION, ETCD_VERSION (see hack/control-plane.sh).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=hack/lib/tier.sh
source hack/lib/tier.sh

# The floor: tests (subtests included) that pass on a machine that passed hack/prereqs.sh,
# at least; raise it when tests are added. Counted 2026-12-02 on a clean clone of main 0d070b0
# (.ci/run, quiet machine): 121 passed, none skipped; +3 with test/rollout's
# TestTrafficCountersAllCountsEveryService (and its iptables and nftables subtests).
E2E_FLOOR=124

log() { echo "test-e2e: $*" >&2; }

if [ -z "${KUBE_APISERVER:-}" ] || [ -z "${ETCD:-}" ]; then
  paths="$(hack/control-plane.sh --env)" || { log "hack/control-plane.sh failed"; exit 1; }
  KUBE_APISERVER="${KUBE_APISERVER:-$(sed -n 's/^KUBE_APISERVER=//p' <<<"$paths")}"
  ETCD="${ETCD:-$(sed -n 's/^ETCD=//p' <<<"$paths")}"
fi
export KUBE_APISERVER ETCD
log "kube-apiserver: $KUBE_APISERVER"
log "etcd: $ETCD"

if [ -n "${SLUICE_BIN:-}" ] || [ -n "${MAKELEVEL:-}" ]; then
  : # given, or built already by make test-e2e (build is its prerequisite)
elif command -v make >/dev/null && make -n build >/dev/null 2>&1; then
  log "building bin/sluice (make build)"
  make --no-print-directory build
fi
if [ -z "${SLUICE_BIN:-}" ] && [ -x bin/sluice ]; then
  export SLUICE_BIN="${root}/bin/sluice"
fi
if [ -z "${SLUICE_ECHOSERVER:-}" ] && [ -x bin/echoserver ]; then
  export SLUICE_ECHOSERVER="${root}/bin/echoserver"
fi

if [ -z "${SLUICE_E2E_BIN:-}" ]; then
  log "building bin/sluice-race (sluice with the race detector)"
  # Built like make test-race builds its packages (cgo, no -trimpath), so it reuses their
  # race-instrumented dependencies from the build cache.
  CGO_ENABLED=1 go build -race -o bin/sluice-race ./cmd/sluice
  export SLUICE_E2E_BIN="${root}/bin/sluice-race"
fi

tier_require
floor="$E2E_FLOOR"
if narrowed "$@"; then floor=0; fi
# shellcheck disable=SC2086 # GOTESTFLAGS is a list of flags
counted e2e "$floor" -v -- go test -json -tags e2e -count=1 -timeout "${E2E_TIMEOUT:-20m}" ${GOTESTFLAGS:-} \
  ./test/e2e/... ./test/deploy/... ./test/sandbox/... ./test/rollout/... "$@"
