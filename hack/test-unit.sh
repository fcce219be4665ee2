#!/usr/bin/env bash
# The fast tier (make test-unit): unit, golden and fake-backed tests; no root, no netns.
# go test's result cache makes a re-run of unchanged packages instant.
#
# The run goes through hack/testcount (output as plain go test prints it, then a count and
# the skipped tests): it fails when fewer than UNIT_FLOOR tests pass.
#
# Usage: hack/test-unit.sh [go test flags or packages, e.g. -run TestX ./pkg/model]
# Environment: GOTESTFLAGS (extra go test flags), SLUICE_REQUIRE (test/require; default
# loopback, which every machine has).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib/tier.sh
source hack/lib/tier.sh

# The floor: tests (subtests included) that pass, at least; raise it when tests are added.
# Counted 2026-12-02 on a clean clone of main 93ecea4 (.ci/run): 1465 passed,
# TestWriteFuzzSeedCorpus skipped (it only rewrites the seed corpus).
UNIT_FLOOR=1465

export SLUICE_REQUIRE="${SLUICE_REQUIRE-loopback}"
floor="$UNIT_FLOOR"
pkgs=(./...)
for a in "$@"; do
  case "$a" in ./*|github.com/*) pkgs=(); floor=0 ;; esac
done
if narrowed "$@"; then floor=0; fi
# shellcheck disable=SC2086 # GOTESTFLAGS is a list of flags
counted unit "$floor" -- go test -json ${GOTESTFLAGS:-} ${pkgs[@]+"${pkgs[@]}"} "$@"
