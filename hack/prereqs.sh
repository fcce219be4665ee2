#!/usr/bin/env bash
# Checks, before any test runs, everything the test tiers need from the machine, and installs
# the missing apt packages. `make test` runs it first (for every tier), each `make test-<tier>`
# for its own tier, and .ci/run on a fresh CI machine: one list, so they cannot drift.
#
# Usage: hack/prereqs.sh [TIER...]     TIER: unit verify race kernel e2e conformance ipvs all
#                                      (default all: what `make test` runs)
#
# Missing apt packages are installed (apt-get, with a dpkg lock wait) when the script runs as
# root on a machine with apt-get: the tiers need root anyway, and a newcomer's `make test`
# must not stop after half an hour because qemu is missing. SLUICE_PREREQS=check only checks
# and prints the command to run instead. What cannot be installed (root, Go, kernel features,
# disk, memory) stops the run at once with what to do. Exit status 0 when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "prereqs: $*" >&2; }

tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(all)
want() { # want TIER: whether TIER is among the ones asked for
  local t
  for t in "${tiers[@]}"; do
    [ "$t" = all ] || [ "$t" = "$1" ] && return 0
  done
  return 1
}
for t in "${tiers[@]}"; do
  case "$t" in unit|verify|race|kernel|e2e|conformance|ipvs|all) ;; *) log "unknown tier ${t}"; exit 2 ;; esac
done

problems=()
problem() { problems+=("$*"); }

# --- apt packages --------------------------------------------------------------------------
# Userspace the tests drive: iptables (nft and legacy flavours), nftables (inspection only;
# sluice itself never runs nft), ipset, conntrack, iproute2 for the netns topologies, kmod,
# socat; gcc and libc6-dev for cgo, which the race detector needs; qemu, busybox and cpio for
# the IPVS VM, and procps for its sysctl (its initramfs is built from the host's binaries,
# hack/vm/tools.list; a minimal Debian image has no procps).
packages=(make iproute2)
if want kernel || want e2e || want conformance || want ipvs; then
  packages+=(iptables nftables ipset conntrack kmod socat)
fi
if want race || want e2e; then packages+=(gcc libc6-dev); fi
if want ipvs; then packages+=(qemu-system-x86 busybox-static cpio xz-utils procps); fi

missing=()
have_dpkg=0
if command -v dpkg-query >/dev/null 2>&1; then
  have_dpkg=1
  # One dpkg-query for all (a process each costs seconds on a busy machine). It exits 1 when
  # a package was never known to dpkg, which is what a fresh machine looks like: under
  # pipefail that must not end the script before it installs them.
  installed=" $({ dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true; } |
    awk '$NF == "installed" && $(NF-1) == "ok" { printf "%s ", $1 }')"
  for p in "${packages[@]}"; do
    [[ "$installed" == *" ${p} "* ]] || missing+=("$p")
  done
fi
if [ "${#missing[@]}" -gt 0 ]; then
  cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ "${SLUICE_PREREQS:-install}" != check ]; then
    log "installing ${missing[*]} (SLUICE_PREREQS=check only checks)"
    export DEBIAN_FRONTEND=noninteractive
    # Another apt run (unattended-upgrades, a colleague's install) holds the lock for a while.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 &&
      apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
      problem "installing the packages failed; run: ${cmd}"
  else
    problem "missing packages ${missing[*]}; run as root: ${cmd}"
  fi
fi
if [ "$have_dpkg" = 0 ]; then
  # Not Debian: say which commands are needed instead.
  cmds=(make ip unshare nsenter)
  if want kernel || want e2e || want conformance || want ipvs; then
    cmds+=(iptables-legacy-restore iptables-nft-restore ip6tables-legacy-restore ip6tables-nft-restore nft ipset conntrack modprobe socat)
  fi
  if want race || want e2e; then cmds+=(gcc); fi
  if want ipvs; then cmds+=(qemu-system-x86_64 busybox cpio xz depmod sysctl apt-get dpkg-deb); fi
  for c in "${cmds[@]}"; do
    command -v "$c" >/dev/null 2>&1 || problem "missing command ${c} (not a Debian machine: install it with your package manager)"
  done
fi

# --- Go --------------------------------------------------------------------------------------
if ! command -v go >/dev/null 2>&1; then
  problem "no go in PATH (install Go $(sed -n 's/^go //p' go.mod) or newer from https://go.dev/dl and add /usr/local/go/bin to PATH)"
else
  need="$(sed -n 's/^go \([0-9.]*\).*/\1/p' go.mod)"
  have="$(go env GOVERSION | sed 's/^go//; s/[^0-9.].*//')"
  if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
    problem "go ${have} is older than go.mod's ${need} (GOTOOLCHAIN=auto downloads it: unset GOTOOLCHAIN=local, or install ${need})"
  fi
fi

# --- root and kernel ---------------------------------------------------------------------
if want kernel || want e2e || want conformance || want ipvs; then
  if [ "$(id -u)" != 0 ]; then
    problem "the kernel, e2e, conformance and ipvs tiers need root (network namespaces, netfilter); run make test as root"
  elif ! command -v unshare >/dev/null || ! unshare --net true 2>/dev/null; then
    problem "cannot create a network namespace (unshare --net); the kernel needs CONFIG_NET_NS and the container, if any, CAP_SYS_ADMIN"
  else
    # Each probe runs in a throwaway network namespace, so nothing touches the machine's
    # rules, and with a private /run, so it never waits for the xtables lock a long
    # iptables-restore elsewhere on the machine holds (the lock file is not per netns).
    probe() { # probe WHAT CMD...: fail with WHAT when CMD fails in a new netns
      local what="$1" out; shift
      out="$(timeout 60 unshare --net --mount --propagation private -- \
        sh -c 'mount -t tmpfs sluice-prereqs /run && exec "$@"' sh "$@" 2>&1)" ||
        problem "${what}: $* failed in a new network namespace: ${out}"
    }
    # (A command still missing is reported above as a package to install.)
    if command -v nft >/dev/null; then
      probe "the kernel has no nf_tables (CONFIG_NF_TABLES)" nft add table inet sluice_prereqs
    fi
    if command -v iptables-legacy >/dev/null; then
      probe "the kernel has no legacy iptables (CONFIG_IP_NF_IPTABLES)" iptables-legacy -t nat -L -n
      probe "the kernel has no legacy ip6tables (CONFIG_IP6_NF_IPTABLES)" ip6tables-legacy -t nat -L -n
    fi
    probe "the kernel has no veth links (CONFIG_VETH)" ip link add sluice-p0 type veth peer name sluice-p1
    probe "the kernel has no bridges (CONFIG_BRIDGE)" ip link add sluice-br type bridge
    if [ ! -d /proc/sys/net/ipv6 ] || [ "$(cat /proc/sys/net/ipv6/conf/default/disable_ipv6 2>/dev/null)" != 0 ]; then
      problem "IPv6 is disabled (the dual-stack tests need it): sysctl -w net.ipv6.conf.default.disable_ipv6=0, or drop ipv6.disable=1 from the kernel command line"
    fi
  fi
fi

# --- the IPVS VM -----------------------------------------------------------------------------
if want ipvs; then
  mem_kib="$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)"
  # The guest gets 4 GiB (hack/ipvs-vm.sh --memory) and the host still runs go and qemu.
  [ "${mem_kib:-0}" -ge $((5 * 1024 * 1024)) ] ||
    problem "the IPVS VM needs about 5 GiB of memory; this machine has $((mem_kib / 1024)) MiB"
  cache="${SLUICE_CACHE:-${HOME}/.cache/sluice}/vm"
  # The Debian kernel the VM boots comes through apt (hack/ipvs-vm.sh): apt must know it, or
  # a previous run must have cached one.
  if command -v apt-cache >/dev/null && ! ls "${cache}"/kernel/*/.complete >/dev/null 2>&1 &&
    ! apt-cache show --no-all-versions "${SLUICE_VM_KERNEL:-linux-image-amd64}" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && [ "${SLUICE_PREREQS:-install}" != check ]; then
      log "apt knows no Debian kernel package for the IPVS VM yet; running apt-get update"
      apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || true
    fi
    apt-cache show --no-all-versions "${SLUICE_VM_KERNEL:-linux-image-amd64}" >/dev/null 2>&1 ||
      problem "apt cannot find ${SLUICE_VM_KERNEL:-linux-image-amd64}, the kernel the IPVS VM boots; run: apt-get update"
  fi
fi

# --- disk ----------------------------------------------------------------------------------
# First run: the module cache and build cache for kube-apiserver, etcd and kube-proxy (~6 GiB),
# race builds, the VM's kernel and initramfs.
if want e2e || want conformance || want ipvs || want race; then
  for d in "$(go env GOCACHE 2>/dev/null || echo "$HOME")" "${SLUICE_CACHE:-${HOME}/.cache/sluice}" "${TMPDIR:-/tmp}"; do
    p="$d"
    while [ ! -d "$p" ]; do p="$(dirname "$p")"; done
    free_kib="$(df -Pk "$p" | awk 'NR == 2 { print $4 }')"
    [ "${free_kib:-0}" -ge $((10 * 1024 * 1024)) ] ||
      problem "less than 10 GiB free on the file system of ${d} ($((free_kib / 1024)) MiB); the first run builds kube-apiserver, etcd and kube-proxy"
  done
fi

if [ "${#problems[@]}" -gt 0 ]; then
  log "the machine is not ready for: ${tiers[*]}"
  for p in "${problems[@]}"; do log "  - ${p}"; done
  exit 1
fi
exit 0
