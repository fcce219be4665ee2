#!/usr/bin/env bash
# Backends and helpers against the real kernel (root). Each test binary re-executes itself in
# a private network namespace (test/netnstest), so nothing touches the root namespace.
# IPVS kernel tests skip here (this kernel has no IPVS) and run in the VM (hack/ipvs-vm.sh).
# The run goes through hack/testcount: it fails when fewer than KERNEL_FLOOR tests pass.
#
# Usage: hack/test-kernel.sh [go test flags, e.g. -run TestKernelNAT ./pkg/dataplane/nftables]
# Environment: KERNEL_TIMEOUT, GOTESTFLAGS, SLUICE_REQUIRE (hack/lib/tier.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib/tier.sh
source hack/lib/tier.sh

# The floor: tests (subtests included) that pass on a machine that passed hack/prereqs.sh,
# at least; raise it when tests are added. Counted 2026-12-02 on a clean clone of main 93ecea4
# (.ci/run, quiet machine): 1391 tests, 1371 passed, 20 skipped (the IPVS kernel tests, which
# run in the VM; the echo server's SCTP tests, likewise; two helpers run only by a benchmark or
# by hand).
KERNEL_FLOOR=1371

if [ "$(id -u)" != 0 ]; then
  echo "test-kernel: needs root (network namespaces)" >&2
  exit 1
fi
tier_require
floor="$KERNEL_FLOOR"
if narrowed "$@"; then floor=0; fi
pkgs="$(go list -tags kernel -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./pkg/... ./test/netnstest/... ./test/topology/... ./test/echoserver/... | tr '\n' ' ')"
# One package at a time (-p 1): the benchmarks and tests measure timing-sensitive things
# and the machine has two cores.
# shellcheck disable=SC2086
counted kernel "$floor" -- go test -json -tags kernel -count=1 -p 1 -timeout "${KERNEL_TIMEOUT:-20m}" ${GOTESTFLAGS:-} $pkgs "$@"
