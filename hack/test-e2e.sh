#!/usr/bin/env bash
# Runs sluice's end-to-end tests (test/e2e, build tag e2e) against a real etcd and
# kube-apiserver started by test/framework/controlplane.
#
#   1. hack/control-plane.sh builds the two binaries if they are not cached yet (about
#      9 minutes the first time, then instant) and its paths are exported as
#      KUBE_APISERVER and ETCD, so no test has to run the script again.
#   2. bin/sluice is built with `make build`, unless make is already running us (make
#      test-e2e depends on build) or the Makefile has no build target. Its path is
#      exported as SLUICE_BINARY.
#   3. go test -tags e2e -count=1 -v ./test/e2e/... runs with a timeout of $E2E_TIMEOUT
#      (default 20m); the tests log their control plane's start-up time.
#
# Usage: hack/test-e2e.sh [go test flags, e.g. -run TestControlPlane]
# Environment: E2E_TIMEOUT, GOTESTFLAGS (extra go test flags), SLUICE_CACHE, KUBE_VERSION,
# ETCD_VERSION (see hack/control-plane.sh).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

log() { echo "test-e2e: $*" >&2; }

paths="$(hack/control-plane.sh --env)"
KUBE_APISERVER="$(sed -n 's/^KUBE_APISERVER=//p' <<<"$paths")"
ETCD="$(sed -n 's/^ETCD=//p' <<<"$paths")"
export KUBE_APISERVER ETCD
log "kube-apiserver: $KUBE_APISERVER"
log "etcd: $ETCD"

if [ -n "${MAKELEVEL:-}" ]; then
  : # make test-e2e has built bin/sluice already (build is its prerequisite)
elif command -v make >/dev/null && make -n build >/dev/null 2>&1; then
  log "building bin/sluice (make build)"
  make build
fi
if [ -x bin/sluice ]; then
  export SLUICE_BINARY="${root}/bin/sluice"
fi

# shellcheck disable=SC2086 # GOTESTFLAGS is a list of flags
exec go test -tags e2e -count=1 -v -timeout "${E2E_TIMEOUT:-20m}" ${GOTESTFLAGS:-} ./test/e2e/... "$@"
