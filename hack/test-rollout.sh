#!/usr/bin/env bash
# Runs the rollout tests (test/rollout, build tag rollout): sluice as a process in a network
# namespace node against a real etcd and kube-apiserver, with real packets. They check what
# a fleet-wide rollout depends on: starting on a configuration upstream starts with, being
# alive before ready, warning instead of crash-looping on the node's environment. Needs
# root (network and mount namespaces); the tests re-execute in a private network namespace.
#
#   1. Unless $KUBE_APISERVER and $ETCD are set, hack/control-plane.sh builds the two
#      binaries if they are not cached yet and their paths are exported.
#   2. bin/sluice and bin/echoserver are built with `make build` unless make is running us
#      (make test-rollout depends on build) or $SLUICE_BIN is set.
#   3. go test -tags rollout -count=1 -v ./test/rollout/ runs with a timeout of
#      $ROLLOUT_TIMEOUT (default 20m).
#
# Usage: hack/test-rollout.sh [go test flags, e.g. -run TestReadOnlyProcSys]
# Environment: ROLLOUT_TIMEOUT, GOTESTFLAGS, SLUICE_BIN, SLUICE_ECHOSERVER,
# SLUICE_TEST_ARTIFACTS (keep every process log there), SLUICE_CACHE.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

log() { echo "test-rollout: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "needs root (network and mount namespaces, netfilter)"
  exit 1
fi

if [ -z "${KUBE_APISERVER:-}" ] || [ -z "${ETCD:-}" ]; then
  paths="$(hack/control-plane.sh --env)" || { log "hack/control-plane.sh failed"; exit 1; }
  KUBE_APISERVER="${KUBE_APISERVER:-$(sed -n 's/^KUBE_APISERVER=//p' <<<"$paths")}"
  ETCD="${ETCD:-$(sed -n 's/^ETCD=//p' <<<"$paths")}"
fi
export KUBE_APISERVER ETCD

if [ -z "${SLUICE_BIN:-}" ] && [ -z "${MAKELEVEL:-}" ]; then
  make --no-print-directory build || { log "make build failed"; exit 1; }
fi
if [ -z "${SLUICE_BIN:-}" ] && [ -x bin/sluice ]; then
  export SLUICE_BIN="${root}/bin/sluice"
fi
if [ -z "${SLUICE_ECHOSERVER:-}" ] && [ -x bin/echoserver ]; then
  export SLUICE_ECHOSERVER="${root}/bin/echoserver"
fi

# shellcheck disable=SC2086 # GOTESTFLAGS is a list of flags
exec go test -tags rollout -count=1 -v -timeout "${ROLLOUT_TIMEOUT:-20m}" ${GOTESTFLAGS:-} ./test/rollout/ "$@"
