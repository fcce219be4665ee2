#!/usr/bin/env bash
# Runs golangci-lint, at the version pinned here, over the whole tree with the checked-in
# .golangci.yml (which lists every build tag the tree uses). hack/verify.sh runs it.
#
# The binary comes from the Go module proxy like the repo's other tools (hack/control-plane.sh):
# `go install` into GOBIN (default $(go env GOPATH)/bin) when it is missing or another
# version, so only the first run pays for the build (a few minutes on 2 cores); later runs
# also reuse golangci-lint's own cache (~/.cache/golangci-lint).
#
# Usage: hack/golangci-lint.sh [golangci-lint run flags, e.g. --fix or ./pkg/model/...]
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=v2.15.0

gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
bin="${gobin}/golangci-lint"
# `golangci-lint version` prints "golangci-lint has version 2.15.0 built with ...".
if ! [ -x "$bin" ] || ! "$bin" version 2>/dev/null | grep -q "version ${VERSION#v} "; then
  echo "golangci-lint: installing ${VERSION} into ${gobin} from the Go module proxy (first run only)" >&2
  # Not under this module's settings: a tool install must not see -mod=vendor or a go.work.
  GOWORK=off GOFLAGS= GOBIN="$gobin" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@${VERSION}"
fi

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(./...)
exec "$bin" run "${args[@]}"
