#!/usr/bin/env bash
# The sluice sandbox: a real kube-apiserver and etcd, two nodes made of network namespaces
# with pods running an echo server, sample Services, and sluice on each node. It prints what
# clients get through every Service and where to look, then stays up until Ctrl-C (or
# `hack/demo.sh down` from another shell) and removes everything. hack/demo/README.md
# describes it; the Go code is test/sandbox.
#
# Usage: hack/demo.sh up [--once] [-v]     build what is missing, start, print, stay up
#                                          (--once: print, then tear down; -v: details)
#        hack/demo.sh down                 stop a running sandbox from another shell, or
#                                          remove what a killed one left
#
# Environment:
#   MODE             sluice's mode: iptables (default, upstream's default), nftables, or ipvs
#                    (needs a kernel with the ip_vs module; fails at once without one)
#   SLUICE_DEMO_DIR  run directory: state file, logs, kubeconfig (default /tmp/sluice-demo);
#                    one sandbox per directory
#   SLUICE_BIN, SLUICE_ECHOSERVER
#                    prebuilt binaries (default: `make build`, bin/sluice and bin/echoserver)
#   KUBE_APISERVER, ETCD, SLUICE_CACHE, KUBE_VERSION, ETCD_VERSION
#                    see hack/control-plane.sh (built once from the Go module proxy, cached)
#
# Needs root, Go, iproute2, and iptables or nftables support in the kernel, as the
# conformance suite does.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

MODE="${MODE:-iptables}"
RUN_DIR="${SLUICE_DEMO_DIR:-/tmp/sluice-demo}"
SANDBOX="${root}/bin/sluice-sandbox"

log() { echo "demo: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() { sed -n 's/^# \{0,1\}//; /^Usage:/,/^$/p' "$0"; }

build_sandbox() {
  command -v go >/dev/null || die "go is not in PATH"
  CGO_ENABLED=0 go build -o "$SANDBOX" ./test/sandbox/cmd/sandbox || die "building the sandbox (test/sandbox/cmd/sandbox) failed"
}

up() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, a bridge, netfilter rules inside the namespaces)"
  case "$MODE" in
    iptables | nftables) ;;
    ipvs)
      # Fail before building anything: the sandbox cannot work without IPVS.
      modprobe -q ip_vs 2>/dev/null || true
      if [ ! -e /proc/net/ip_vs ]; then
        die "MODE=ipvs needs a kernel with IPVS (the ip_vs module), and this kernel has none (modprobe ip_vs failed).
      Use MODE=nftables or MODE=iptables here; the IPVS backend is tested in a VM running Debian's
      kernel with make test-ipvs (hack/ipvs-vm.sh)."
      fi
      ;;
    *) die "MODE=$MODE: want iptables, nftables or ipvs" ;;
  esac
  for tool in ip modprobe; do
    command -v "$tool" >/dev/null || die "$tool is not in PATH (package iproute2 / kmod)"
  done
  # Bridged pod traffic must go through netfilter, as on a real node.
  modprobe -q br_netfilter 2>/dev/null || true
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || die "the br_netfilter module is missing (modprobe br_netfilter)"

  if [ -z "${SLUICE_BIN:-}" ] && [ -z "${MAKELEVEL:-}" ]; then
    log "building bin/sluice and bin/echoserver (make build)"
    make --no-print-directory build >&2
  fi
  SLUICE_BIN="${SLUICE_BIN:-${root}/bin/sluice}"
  SLUICE_ECHOSERVER="${SLUICE_ECHOSERVER:-${root}/bin/echoserver}"
  [ -x "$SLUICE_BIN" ] || die "$SLUICE_BIN is missing (make build)"
  [ -x "$SLUICE_ECHOSERVER" ] || die "$SLUICE_ECHOSERVER is missing (make build)"

  if [ -z "${KUBE_APISERVER:-}" ] || [ -z "${ETCD:-}" ]; then
    log "finding kube-apiserver and etcd (hack/control-plane.sh; the first build takes about 9 minutes, then they are cached)"
    paths="$(hack/control-plane.sh --env)" || die "hack/control-plane.sh failed"
    KUBE_APISERVER="${KUBE_APISERVER:-$(sed -n 's/^KUBE_APISERVER=//p' <<<"$paths")}"
    ETCD="${ETCD:-$(sed -n 's/^ETCD=//p' <<<"$paths")}"
  fi
  export KUBE_APISERVER ETCD

  build_sandbox
  exec "$SANDBOX" up --run-dir "$RUN_DIR" --mode "$MODE" --sluice "$SLUICE_BIN" --echoserver "$SLUICE_ECHOSERVER" "$@"
}

down() {
  [ "$(id -u)" = 0 ] || die "needs root"
  [ -x "$SANDBOX" ] || build_sandbox
  exec "$SANDBOX" down --run-dir "$RUN_DIR"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) shift; down "$@" ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
