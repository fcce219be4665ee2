#!/usr/bin/env bash
# The race tier (make test-race): the unit tests of the packages that run goroutines, under
# the race detector. Needs cgo (gcc; hack/prereqs.sh race installs it). go test's result
# cache makes a re-run of unchanged packages instant.
#
# Every package runs under -race except those listed in RACE_SEQUENTIAL: their code runs on
# one goroutine and their tests are CPU-bound renders of big states, which the detector slows
# ten- to twenty-fold for nothing (measured: pkg/dataplane/iptables 5 s -> 82 s, nftables
# 3 s -> 65 s). Of those, the tests that do start goroutines run in RACE_ALSO. New packages
# are raced by default.
#
# The run goes through hack/testcount: it fails when fewer than RACE_FLOOR tests pass.
#
# Usage: hack/test-race.sh [go test flags]
# Environment: GOTESTFLAGS (extra go test flags).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib/tier.sh
source hack/lib/tier.sh

# The floor: tests (subtests included) that pass under -race, at least; raise it when tests
# are added. Counted 2026-12-02 on a clean clone of main 93ecea4 (.ci/run): 785 passed,
# TestWriteFuzzSeedCorpus skipped (it only rewrites the seed corpus).
RACE_FLOOR=785

# Packages left out, and why (see above).
RACE_SEQUENTIAL=(
  github.com/sluiceproxy/sluice/cmd/sluice               # the CLI: one goroutine; status/explain of 10 000 Services
  github.com/sluiceproxy/sluice/pkg/config               # parsing and validation
  github.com/sluiceproxy/sluice/pkg/explain              # a pure function of a state
  github.com/sluiceproxy/sluice/pkg/dataplane/iptables   # the pure rule generator (but see RACE_ALSO)
  github.com/sluiceproxy/sluice/pkg/dataplane/nftables   # the pure planner; its netlink mutex is raced by the kernel tier's traffic tests only
  github.com/sluiceproxy/sluice/hack/scale               # the benchmark harness
  github.com/sluiceproxy/sluice/hack/testcount           # this tier's own counter
  github.com/sluiceproxy/sluice/test/deploy              # manifests and metric names
)
# Tests of left-out packages that do run goroutines: "PACKAGE -run PATTERN".
RACE_ALSO=(
  "./pkg/dataplane/iptables ^TestFlushedTablesAreRewritten$" # Monitor's canary goroutine against Apply
)

export SLUICE_REQUIRE="${SLUICE_REQUIRE-loopback}"
floor="$RACE_FLOOR" narrow=0
if narrowed "$@"; then floor=0 narrow=1; fi
pkgs=()
while IFS= read -r p; do
  skip=0
  for s in "${RACE_SEQUENTIAL[@]}"; do [ "$p" = "$s" ] && skip=1; done
  [ "$skip" = 1 ] || pkgs+=("$p")
done < <(go list ./...)

run() {
  local rc=0 spec pkg pattern
  # shellcheck disable=SC2086 # GOTESTFLAGS is a list of flags
  CGO_ENABLED=1 go test -race -json ${GOTESTFLAGS:-} "${pkgs[@]}" "$@" || rc=1
  if [ "$narrow" = 0 ]; then # a narrowed run (-run) is about the main packages
    for spec in "${RACE_ALSO[@]}"; do
      read -r pkg pattern <<<"$spec"
      # shellcheck disable=SC2086
      CGO_ENABLED=1 go test -race -json ${GOTESTFLAGS:-} -run "$pattern" "$pkg" "$@" || rc=1
    done
  fi
  return "$rc"
}
counted race "$floor" -- run "$@"
