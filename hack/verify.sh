#!/usr/bin/env bash
# Static checks: formatting, go vet (every build tag), golangci-lint, the logging rule, and
# the import direction of the layers (API -> model -> backend -> kernel; see README "Layout").
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
  echo "verify: not gofmt'ed:" >&2
  echo "$unformatted" >&2
  fail=1
fi

go vet ./...
go vet -tags kernel ./pkg/... ./test/netnstest/... ./test/topology/... ./test/echoserver/...
go vet -tags e2e ./test/e2e/... ./test/deploy/... ./test/sandbox/... ./test/rollout/...
go vet -tags conformance ./test/conformance/...
go vet -tags vm ./test/vm/...
go vet -tags vmharness ./test/vm/...

# golangci-lint (.golangci.yml: the standard linters plus staticcheck, errorlint, nolintlint,
# misspell, unconvert, copyloopvar) over every build tag; any finding fails verify.
if ! hack/golangci-lint.sh; then
  echo "verify: golangci-lint found problems (above); hack/golangci-lint.sh runs it alone" >&2
  fail=1
fi

# Library code logs through klog's structured logger (docs/logging.md): never straight to
# stderr/stdout, the standard log package, print/println, or klog's printf functions.
if out=$(git grep -nE 'fmt\.Fprint(f|ln)?\(os\.Std(err|out)|(^|[^.A-Za-z0-9_])println?\(|\blog\.(Print|Fatal|Panic)|klog\.[A-Z][a-z]+f\(' -- 'pkg/*.go' ':!*_test.go'); then
  echo "verify: pkg/ writes diagnostics outside klog's structured logger (docs/logging.md):" >&2
  echo "$out" >&2
  fail=1
fi

# forbid PKG_PATTERN IMPORT_REGEX WHY [EXCEPT_REGEX]: no package matching PKG_PATTERN (other
# than those whose import path matches EXCEPT_REGEX) may import (directly) a package matching
# IMPORT_REGEX.
# A go list error (a pattern that matches nothing, a package that does not load) fails the
# check: an empty list would otherwise pass it.
forbid() {
  local pkgs="$1" re="$2" why="$3" except="${4:-^$}" list out errs
  errs="$(mktemp)"
  # shellcheck disable=SC2086 # pkgs is a list of patterns
  if ! list=$(go list -f '{{.ImportPath}}: {{join .Imports " "}}' $pkgs 2>"$errs") || [ -s "$errs" ] || [ -z "$list" ]; then
    echo "verify: go list ${pkgs} failed, so the rule \"${why}\" was not checked:" >&2
    cat "$errs" >&2
    [ -n "$list" ] || echo "(no packages)" >&2
    rm -f "$errs"
    fail=1
    return
  fi
  rm -f "$errs"
  out=$(awk -v re="$re" -v except="$except" '{ pkg = substr($1, 1, length($1) - 1) }
    pkg !~ except { for (i = 2; i <= NF; i++) if ($i ~ re) print $1 " imports " $i }' <<<"$list")
  if [ -n "$out" ]; then
    echo "verify: $why" >&2
    echo "$out" >&2
    fail=1
  fi
}
forbid ./pkg/model/... '^(k8s\.io/client-go|github\.com/sluiceproxy/sluice/pkg/(dataplane|syncloop|app|watch|health|conntrack|hostnet)|github\.com/(vishvananda|google/nftables|moby|coreos))' \
  "the model is pure: no client-go, no backend, no netlink, no host I/O"
# The backends' test fixture builds API objects for tests that go through model.Compute; it
# is test support, and the next rule keeps it so.
forbid ./pkg/dataplane/... '^(k8s\.io/api/|k8s\.io/client-go|github\.com/sluiceproxy/sluice/pkg/(syncloop|app|watch|config))' \
  "backends see only the model's types, never API objects, the sync loop or the config" \
  '/pkg/dataplane/internal/fixture$'
forbid ./... '^github\.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture$' \
  "only tests use the backends' test fixture"
forbid ./pkg/dataplane/leftovers/... '^github\.com/sluiceproxy/sluice/pkg/(dataplane/(iptables|ipvs|nftables|recording)|health|conntrack|metrics)$' \
  "leftovers sits below the backends: each of them uses it, it knows none of them"
forbid ./pkg/hostnet/... '^(k8s\.io/|github\.com/sluiceproxy/sluice/)' \
  "hostnet is a leaf under the node-side packages: it knows nothing of sluice or Kubernetes"
forbid ./pkg/watch/... '^github\.com/sluiceproxy/sluice/pkg/(dataplane|syncloop|app)' \
  "the watch layer only records changes"
forbid ./pkg/syncloop/... '^(k8s\.io/client-go|github\.com/sluiceproxy/sluice/pkg/(watch|app|config))' \
  "the sync loop knows the tracker and backends, not the API"

exit $fail
