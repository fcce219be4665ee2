# shellcheck shell=bash
# What every test tier script shares (sourced, not run): the features the machine must have,
# and running a tier's tests through hack/testcount against the floor the tier states.

# The features every machine that passed hack/prereqs.sh has (test/require: a test that
# finds one missing fails instead of skipping). CI sets SLUICE_REQUIRE itself to what its
# machine type has on top (.ci/run); an explicit SLUICE_REQUIRE, even empty, wins.
TIER_HOST_REQUIRE="root,ipv6,ipset,iptables-legacy,iptables-nft,nft,loopback"

# tier_require exports SLUICE_REQUIRE for the host tiers, unless the caller set it.
tier_require() {
  export SLUICE_REQUIRE="${SLUICE_REQUIRE-${TIER_HOST_REQUIRE}}"
  echo "$(basename "$0"): SLUICE_REQUIRE=${SLUICE_REQUIRE}" >&2
}

# testcount_bin builds hack/testcount once per checkout state and prints its path.
testcount_bin() {
  local root out
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  out="${root}/bin/testcount"
  (cd "$root" && CGO_ENABLED=0 go build -o "$out" ./hack/testcount) || return 1
  echo "$out"
}

# counted TIER FLOOR [TESTCOUNT-FLAGS...] -- CMD...: runs CMD, whose output is go test -json
# (or -test.v text with the -text flag), through hack/testcount: its output shows as go test's
# would, then a summary and the skipped tests. Fails when CMD fails, a test fails, or fewer
# than FLOOR tests passed. A FLOOR of 0 (a run narrowed with -run) only requires some test.
counted() {
  local tier="$1" floor="$2" flags=() tc rc
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
  [ "${1:-}" = -- ] || { echo "counted: usage: counted TIER FLOOR [FLAGS...] -- CMD..." >&2; return 2; }
  shift
  tc="$(testcount_bin)" || { echo "counted: building hack/testcount failed" >&2; return 1; }
  if "$@" 2>&1 | "$tc" -tier "$tier" -floor "$floor" ${flags[@]+"${flags[@]}"}; then
    return 0
  else
    rc=("${PIPESTATUS[@]}")
  fi
  [ "${rc[0]}" = 0 ] || echo "counted: ${tier}: the tests exited with status ${rc[0]}" >&2
  return 1
}

# narrowed ARGS...: whether a tier's extra go test flags select part of it (-run, -skip,
# -short), in which case its floor does not apply.
narrowed() {
  local a
  for a in "$@" ${GOTESTFLAGS:-}; do
    case "$a" in -run|-run=*|-test.run*|-skip|-skip=*|-test.skip*|-short|-test.short*) return 0 ;; esac
  done
  return 1
}
