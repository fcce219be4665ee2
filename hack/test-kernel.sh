#!/usr/bin/env bash
# Backends and helpers against the real kernel (root). Each test binary re-executes itself in
# a private network namespace (test/netnstest), so nothing touches the root namespace.
# IPVS kernel tests skip here (this kernel has no IPVS) and run in the VM (hack/ipvs-vm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "test-kernel: needs root (network namespaces)" >&2
  exit 1
fi
# One package at a time (-p 1): the benchmarks and tests measure timing-sensitive things
# and the machine has two cores.
# shellcheck disable=SC2086
exec go test -tags kernel -count=1 -p 1 -timeout "${KERNEL_TIMEOUT:-20m}" ${GOTESTFLAGS:-} \
  $(go list -tags kernel -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./pkg/... ./test/netnstest/... ./test/topology/... ./test/echoserver/... | tr '\n' ' ') "$@"
