#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 30s). New interesting inputs stay in the
# Go build cache; crashers are written to the package's testdata/fuzz/<Target>/ (commit them
# with the fix). Seed corpora in testdata/fuzz are also run by plain `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-30s}"
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    echo "fuzz: $pkg $target ($FUZZTIME)"
    # Large structured inputs take long to minimise; keep minimisation short so the time
    # goes to exploring.
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 5s "$pkg"
  done
done
