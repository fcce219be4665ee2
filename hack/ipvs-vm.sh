#!/usr/bin/env bash
# Runs sluice's IPVS tests (or any command) inside a qemu VM booted on Debian's stock kernel,
# which has IPVS, dummy interfaces and SCTP as modules; the CI host kernel has none of them.
# hack/vm/README.md explains the VM, its timings and how to debug it.
#
# Usage:
#   hack/ipvs-vm.sh [options]                      build the VM test suites and run them (make test-ipvs)
#   hack/ipvs-vm.sh [options] -- CMD [ARG...]      run one command in the guest; exit with its status
#
# Options:
#   --timeout S              hard limit for the whole VM run, boot included (default 2400)
#   --file HOST[:GUEST]      copy a file or directory into the guest (default GUEST: /sluice/work/NAME);
#                            /sluice/bin and /sluice/work are on the guest's PATH
#   --share HOST:GUEST[:rw]  mount a host directory in the guest over 9p (read-only unless :rw)
#   --memory MIB, --cpus N   guest size (default 4096 MiB, 2 vCPUs)
#   --keep                   keep the temporary directory (initramfs, console log) for debugging
#
# Environment: SLUICE_CACHE (default ~/.cache/sluice; the VM parts go to $SLUICE_CACHE/vm),
# SLUICE_VM_KERNEL (a Debian kernel package to pin, e.g. linux-image-6.1.0-56-amd64),
# SLUICE_VM_ACCEL (tcg, the default, or kvm where /dev/kvm really works),
# SLUICE_VM_TESTFLAGS (extra test-binary flags for the default suites, e.g. -test.run=Probe),
# SLUICE_VM_SUITES (names of the default suites to run, e.g. "ipvs vm"; default all),
# SLUICE_VM_TEST_TIMEOUT (each suite's -test.timeout, default 20m),
# SLUICE_VM_ARTIFACTS (a host directory that receives the conformance suites' process logs, and
# their results in results/), KUBE_PROXY_BIN (upstream kube-proxy for the conformance suites;
# default: hack/kube-proxy-reference.sh's),
# SLUICE_CONFORMANCE_READY_TIMEOUT (the control plane's readiness limit in the guest, default 5m),
# KUBE_APISERVER, ETCD (the control plane to run; default: hack/control-plane.sh's).
#
# The guest prints "<marker>=<status>" when the command ends; the marker carries a random nonce,
# so no output of the command can fake it. Exit status: the command's, 124 on timeout, 125 when
# the VM died without reporting one (kernel panic, broken initramfs), 2 on a usage error.
set -euo pipefail
shopt -s extglob

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VMDIR="${ROOT}/hack/vm"
CACHE="${SLUICE_CACHE:-${HOME}/.cache/sluice}/vm"
MODULE_PATH="github.com/sluiceproxy/sluice"

# The default suites: name (for SLUICE_VM_SUITES), package, build tags, then flags for the test
# binary. Each package is built once per build tags into /sluice/bin in the guest (suites that
# differ only in flags share it), and each suite runs in a copy of its package's testdata.
#
# Suites built with the conformance tag get what test/conformance needs: sluice and the echo
# server (built from this tree), upstream kube-proxy (hack/kube-proxy-reference.sh, or
# $KUBE_PROXY_BIN), kube-apiserver and etcd (hack/control-plane.sh, or $KUBE_APISERVER and
# $ETCD), and the environment in conformance_env below. The conformance suite runs whole
# against sluice in ipvs mode (not upstream: see below); its SCTP case also runs against sluice
# and upstream in iptables and nftables mode, because only the VM's kernel has SCTP (it is skipped on the CI
# host); so do the echo server's and probe's own SCTP tests. All six clusters share one
# control plane in one test process: the four iptables and nftables ones are restricted to
# the SCTP case (-proxies "...:SCTPClusterIPAndNodePort"), which runs first, and then stop
# (a separate suite cost a second control-plane start under TCG). The suite writes its results
# to a share, and the host compares sluice's with upstream's afterwards
# (go run ./test/conformance/checkresults).
#
# Upstream kube-proxy in ipvs mode is not among the clusters: under TCG one of its syncs takes
# 29 to 84 s per family (its own "syncProxyRules complete" log lines, 2026-12-02: it execs
# ipset and iptables-restore several times a sync, and each exec costs seconds in the
# emulated guest), so with the suite's parallel cases a change reaches its IPVS table minutes
# later and nearly every check ran out of its 90 s (a lone case passed: 453 s for
# ClusterIPFromNodeAndPods/IPv4). The ipvs column of the capability table is derived from
# sluice's ipvs run here, and checkresults runs with -reference=false for this VM's results
# (it still compares the SCTP runs of iptables and nftables with upstream's). Where /dev/kvm
# works (SLUICE_VM_ACCEL=kvm), add kube-proxy/ipvs with SLUICE_VM_TESTFLAGS=-proxies=...
# to compare.
sctp_only=":SCTPClusterIPAndNodePort"
SUITES=(
  "ipvs ./pkg/dataplane/ipvs kernel"
  "vm ./test/vm vm"
  "echo ./test/echoserver/echo kernel"
  "conformance-ipvs ./test/conformance conformance -proxies=sluice/ipvs,sluice/iptables${sctp_only},kube-proxy/iptables${sctp_only},sluice/nftables${sctp_only},kube-proxy/nftables${sctp_only} -test.parallel=24"
)

# Each suite's floor: the tests (subtests included) that pass in it, at least (hack/testcount
# counts them in the guest; a suite below its floor fails like a failing test); raise them
# with the tests. A suite missing here fails the run. SLUICE_VM_TESTFLAGS lifts the floors (a
# narrowed run). Counted (2026-12-02) from what each suite runs where every feature is there:
# ipvs 108 tests and subtests less TestKernelNewFailsWithoutIPVS (skips where IPVS is; main
# 0d070b0); vm 11; echo 8 tests and 19 subtests (main 27f5aa2); conformance-ipvs TestConformance,
# its 4 disruptive cases, its 28 other cases and their 80 family variants (TrafficCounters'
# 3 variants skip in the VM: no VM cluster counts traffic; main 27f5aa2).
declare -A SUITE_FLOOR=([ipvs]=108 [vm]=11 [echo]=27 [conformance-ipvs]=113)

# What the guest has (test/require): a test that finds one of these missing fails.
VM_REQUIRE="${SLUICE_VM_REQUIRE:-root,ipv6,sctp,ipvs,ipset,iptables-legacy,iptables-nft,nft,loopback}"

# Under TCG kube-apiserver needs one to two minutes to become ready (the RBAC and other
# bootstrap objects, each write an emulated round trip), and a restart under the suite's
# traffic has taken over 90s, the suite's default made for the host. The flags leave out what
# the suite never uses and what costs time at every start and request: API Priority and
# Fairness (its bootstrap objects, per-request accounting) and the admission plugins with
# informers or webhooks of their own (hack/vm/README.md has the measurements).
CONFORMANCE_READY_TIMEOUT="${SLUICE_CONFORMANCE_READY_TIMEOUT:-5m}"
CONFORMANCE_APISERVER_FLAGS="--enable-priority-and-fairness=false --disable-admission-plugins=LimitRanger,TaintNodesByCondition,Priority,DefaultTolerationSeconds,DefaultStorageClass,StorageObjectInUseProtection,PodGroupProtection,RuntimeClass,DefaultIngressClass,PodTopologyLabels,MutatingAdmissionPolicy,MutatingAdmissionWebhook,PodSecurity,PersistentVolumeClaimResize,CertificateApproval,CertificateSigning,ClusterTrustBundleAttest,CertificateSubjectRestriction,NodeDeclaredFeatureValidator,PodResizeValidator,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook,ResourceQuota"

timeout_s=2400
memory=4096
cpus=2
keep=0
files=()
shares=()
cmd=()

log() { echo "ipvs-vm: $*" >&2; }
die() { log "$*"; exit 2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s="${2:?--timeout needs seconds}"; shift 2 ;;
    --file) files+=("${2:?--file needs HOST[:GUEST]}"); shift 2 ;;
    --share) shares+=("${2:?--share needs HOST:GUEST}"); shift 2 ;;
    --memory) memory="${2:?--memory needs MiB}"; shift 2 ;;
    --cpus) cpus="${2:?--cpus needs a count}"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; cmd=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout wants whole seconds, got ${timeout_s}"

t_start="$(now)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/sluice-vm.XXXXXX")"
qemu_pid=""
cleanup() {
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  if [ "$keep" = 1 ]; then log "kept ${tmp}"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

need() {
  local missing=() c
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  [ ${#missing[@]} -eq 0 ] || die "missing host commands: ${missing[*]} (hack/prereqs.sh ipvs installs them, as root)"
}
need qemu-system-x86_64 busybox cpio depmod modprobe ldd apt-get apt-cache dpkg-deb xz gzip timeout flock awk sha256sum od

# ---------------------------------------------------------------------------------------------
# Kernel: Debian's linux-image package, downloaded once per version into the cache.

# resolve_kernel prints "PACKAGE VERSION" for the kernel to use: the one linux-image-amd64
# points at today (Debian's mirrors keep only the current security build, so pinning an old one
# would break a fresh CI machine), or SLUICE_VM_KERNEL's, or offline the newest cached one.
kernel_stanza() { # one apt-cache call (each costs seconds on a busy machine)
  if [ -n "${SLUICE_VM_KERNEL:-}" ]; then
    apt-cache show --no-all-versions "$SLUICE_VM_KERNEL" 2>/dev/null |
      awk -v p="$SLUICE_VM_KERNEL" '/^Version: / { print p, $2; exit }'
  else
    apt-cache show --no-all-versions linux-image-amd64 2>/dev/null |
      sed -n 's/^Depends:.*\(linux-image-[0-9][^ ]*-amd64\) (= \([^)]*\)).*/\1 \2/p' | head -n1
  fi
}
resolve_kernel() {
  local found
  found="$(kernel_stanza)"
  if [ -z "$found" ] && [ "$(id -u)" = 0 ] && [ -z "$(ls -d "${CACHE}"/kernel/*/.complete 2>/dev/null)" ]; then
    log "apt knows no Debian kernel package yet; running apt-get update"
    apt-get update -qq >&2 || true
    found="$(kernel_stanza)"
  fi
  if [ -z "$found" ]; then
    local cached
    cached="$(ls -1td "${CACHE}"/kernel/*/.complete 2>/dev/null | head -n1)"
    [ -n "$cached" ] || die "cannot resolve a Debian kernel package (run apt-get update, or set SLUICE_VM_KERNEL)"
    cached="$(basename "$(dirname "$cached")")"
    log "apt cannot resolve the kernel package; using the cached ${cached}"
    found="${cached%%_*} ${cached#*_}"
  fi
  echo "$found"
}

# extract_vmlinux writes the uncompressed ELF kernel inside bzImage $1 to $2. Booting the ELF
# through its PVH entry point skips the kernel's self-decompression, which takes ~20 s under TCG.
extract_vmlinux() {
  local bz="$1" out="$2" i off
  # Magic numbers of the compressors Debian has used (bash strings cannot hold NUL bytes, so
  # xz's trailing \0 is left out; a false match just fails to decompress).
  local magics=($'\xfd7zXZ' $'\x28\xb5\x2f\xfd' $'\x1f\x8b\x08') tools=(xz zstd gzip)
  for i in "${!magics[@]}"; do
    command -v "${tools[$i]}" >/dev/null 2>&1 || continue
    for off in $(LC_ALL=C grep -aboF "${magics[$i]}" "$bz" 2>/dev/null | cut -d: -f1 | head -n5); do
      tail -c +"$((off + 1))" "$bz" | "${tools[$i]}" -dc >"$out" 2>/dev/null || true
      if [ "$(head -c4 "$out" | od -An -c | tr -d ' ')" = '177ELF' ]; then return 0; fi
    done
  done
  rm -f "$out"
  return 1
}

fetch_kernel() {
  local pkg="$1" ver="$2" dir="${CACHE}/kernel/${1}_${2}"
  if [ -f "${dir}/.complete" ]; then echo "$dir"; return; fi
  mkdir -p "${CACHE}/kernel"
  (
    flock 9
    [ -f "${dir}/.complete" ] && exit 0
    local t0 work; t0="$(now)"
    work="$(mktemp -d "${CACHE}/kernel/.fetch.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    log "downloading ${pkg}=${ver} (first run for this kernel only)"
    (cd "$work" && apt-get download -q -o APT::Sandbox::User=root "${pkg}=${ver}" >&2)
    dpkg-deb -x "$work"/*.deb "$work/x"
    local kver; kver="$(ls "$work/x/lib/modules")"
    [ -n "$kver" ] || { log "no modules in ${pkg}"; exit 1; }
    rm -rf "$dir"; mkdir -p "$dir/modules/lib/modules"
    mv "$work/x/lib/modules/${kver}" "$dir/modules/lib/modules/"
    cp "$work/x/boot/vmlinuz-${kver}" "$dir/vmlinuz"
    cp "$work/x/boot/config-${kver}" "$dir/config"
    # Debian generates modules.dep at install time; the .deb does not carry it.
    depmod -b "$dir/modules" "$kver"
    if grep -q '^CONFIG_PVH=y' "$dir/config" && extract_vmlinux "$dir/vmlinuz" "$dir/vmlinux"; then :; else
      log "no PVH-bootable vmlinux in ${pkg}; booting the compressed kernel (slow under TCG)"
    fi
    echo "$kver" >"$dir/release"
    touch "$dir/.complete"
    log "kernel ${kver} cached in ${dir} ($(since "$t0")s)"
  ) 9>"${CACHE}/kernel/.lock" || die "fetching ${pkg} failed"
  echo "$dir"
}

# ---------------------------------------------------------------------------------------------
# Initramfs: a base archive (busybox, modules, host tools, /init) and a per-run overlay (the
# command, test binaries, --file contents) concatenated; the kernel unpacks both. Both stay
# uncompressed: under TCG the guest decompresses gzip at a few MB/s, and qemu loads the file in
# a fraction of a second.

declare -A copied=()

# copy_in SRC [DST] copies SRC (dereferenced) to DST (default: the same path) in the base tree.
copy_in() {
  local src="$1" dst="${2:-$1}"
  [ -n "${copied[$dst]:-}" ] && return 0
  copied[$dst]=1
  mkdir -p "${base}$(dirname "$dst")"
  cp -L --preserve=mode "$src" "${base}${dst}"
}

# copy_libs copies every shared library ldd reports for the given ELF files, loader included.
# One ldd for all files: each ldd run costs tens of milliseconds, and there are ~150 files.
copy_libs() {
  local lib
  for lib in $(ldd "$@" 2>/dev/null | awk '/=> \// { print $3 } /^[[:space:]]+\// { print $1 }' | sort -u); do
    copy_in "$lib"
  done
}

build_base() {
  local kdir="$1" kver; kver="$(cat "$kdir/release")"
  base="${tmp}/base"
  mkdir -p "$base"/{usr/bin,usr/sbin,usr/lib,usr/lib64,proc,sys,dev,tmp,run,etc/sluice-vm,sluice/bin,sluice/work}
  # Debian 12's merged /usr, so library paths from the host's ldd hold in the guest.
  ln -s usr/bin "$base/bin"; ln -s usr/sbin "$base/sbin"; ln -s usr/lib "$base/lib"; ln -s usr/lib64 "$base/lib64"

  # Modules: the "include" lines of modules.list and everything they depend on.
  local mroot="$kdir/modules/lib/modules/$kver" want=() path
  while read -r path; do
    if [ -d "$mroot/kernel/$path" ]; then
      while IFS= read -r f; do want+=("${f#"$mroot"/}"); done < <(find "$mroot/kernel/$path" -name '*.ko*')
    elif [ -f "$mroot/kernel/$path" ]; then
      want+=("kernel/$path")
    else
      die "modules.list: no kernel/${path} in ${kver}"
    fi
  done < <(sed -n 's/^include[[:space:]]\{1,\}\([^[:space:]#]*\).*/\1/p' "$VMDIR/modules.list")
  local closure
  closure="$(printf '%s\n' "${want[@]}" | awk -v dep="$mroot/modules.dep" '
    BEGIN { while ((getline line < dep) > 0) { split(line, a, ":"); deps[a[1]] = a[2] } }
    { queue[++n] = $1 }
    END {
      for (i = 1; i <= n; i++) {
        m = queue[i]; if (m in seen) continue; seen[m] = 1; print m
        k = split(deps[m], d, " "); for (j = 1; j <= k; j++) queue[++n] = d[j]
      }
    }')"
  local gm="$base/lib/modules/$kver" m
  mkdir -p "$gm"
  while IFS= read -r m; do
    mkdir -p "$gm/$(dirname "$m")"
    cp "$mroot/$m" "$gm/$m"
  done <<<"$closure"
  cp "$mroot"/modules.{order,builtin,builtin.modinfo} "$gm/"
  depmod -b "$base" "$kver"
  cp "$VMDIR/modules.list" "$base/etc/sluice-vm/modules.list"

  # Host tools with their libraries; names become symlinks where the host has them.
  local name opt host real elfs=()
  while read -r name; do
    opt=0; [[ "$name" == *'?' ]] && { opt=1; name="${name%'?'}"; }
    if ! host="$(command -v "$name" 2>/dev/null)" || [[ "$host" != /* ]]; then
      [ "$opt" = 1 ] && continue
      die "host command ${name} (hack/vm/tools.list) not found; see hack/vm/README.md for the apt packages"
    fi
    real="$(readlink -f "$host")"
    host="/usr${host#/usr}" # /sbin/x and /usr/sbin/x are the same file under merged /usr
    real="/usr${real#/usr}"
    copy_in "$real"
    elfs+=("$real")
    if [ "$host" != "$real" ] && [ ! -e "${base}${host}" ]; then
      mkdir -p "${base}$(dirname "$host")"
      ln -s "$real" "${base}${host}"
    fi
  done < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$VMDIR/tools.list")

  # iptables extensions are dlopen()ed, so ldd of the binaries does not list them.
  local xt
  for xt in /usr/lib/x86_64-linux-gnu/xtables/*.so; do
    [ -e "$xt" ] || continue
    copy_in "$xt"
    elfs+=("$xt")
  done
  copy_libs "${elfs[@]}"
  local f
  for f in /etc/protocols /etc/services /etc/ethertypes /etc/nsswitch.conf /etc/iproute2 /usr/share/iproute2 /etc/xtables; do
    [ -e "$f" ] || continue
    mkdir -p "${base}$(dirname "$f")"
    cp -rL "$f" "${base}${f}"
  done

  # busybox for everything else, never shadowing a real tool.
  cp /bin/busybox "$base/usr/bin/busybox"
  local applet
  for applet in $(/bin/busybox --list); do
    [ -e "$base/usr/bin/$applet" ] || [ -e "$base/usr/sbin/$applet" ] || [ -e "$base/usr/bin/$applet" ] ||
      ln -s busybox "$base/usr/bin/$applet"
  done

  echo "sluice-vm" >"$base/etc/hostname"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsluice-vm\n' >"$base/etc/hosts"
  printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$base/etc/passwd"
  printf 'root:x:0:\ntty:x:5:\nnogroup:x:65534:\n' >"$base/etc/group"
  : >"$base/etc/fstab"
  install -m 0755 "$VMDIR/init" "$base/init"

  (cd "$base" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$tmp/base.cpio"
}

# base_key prints a digest of everything the base archive is made of: the kernel, this script,
# hack/vm/*, and the identity (path, size, mtime) of every host binary copied in. A changed tool
# (apt upgrade) or harness edit rebuilds the archive; nothing else does.
base_key() {
  local kdir="$1" name host
  {
    echo "$kdir"
    cat "${BASH_SOURCE[0]}" "$VMDIR/init" "$VMDIR/modules.list" "$VMDIR/tools.list"
    while read -r name; do
      host="$(command -v "${name%'?'}" 2>/dev/null)" || { echo "absent ${name}"; continue; }
      stat -L -c '%n %s %Y' "$host"
    done < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$VMDIR/tools.list")
    stat -L -c '%n %s %Y' /bin/busybox /usr/lib/x86_64-linux-gnu/xtables/*.so 2>/dev/null
  } | sha256sum | cut -c1-16
}

# cached_base prints the path of the base archive for kernel dir $1, building it when the cache
# has none for the current key. Older archives are removed (keeping a few for other checkouts).
cached_base() {
  local kdir="$1" dir="${CACHE}/initramfs" key out
  key="$(base_key "$kdir")"
  out="${dir}/base-$(cat "$kdir/release")-${key}.cpio"
  if [ -f "$out" ]; then echo "$out"; return; fi
  mkdir -p "$dir"
  (
    flock 9
    [ -f "$out" ] && exit 0
    local t0; t0="$(now)"
    build_base "$kdir"
    mv "$tmp/base.cpio" "$out.tmp" && mv "$out.tmp" "$out"
    rm -rf "$tmp/base"
    ls -1t "$dir"/base-*.cpio | tail -n +4 | xargs -r rm -f
    log "base initramfs built and cached ($(since "$t0")s)"
  ) 9>"${dir}/.lock" || die "building the base initramfs failed"
  echo "$out"
}

# ---------------------------------------------------------------------------------------------
# Per-run overlay: a tree of symlinks to host files, archived with cpio -L (dereferenced), so
# large binaries are read once into the archive instead of being copied twice.

overlay="${tmp}/overlay"
mkdir -p "$overlay/sluice/bin" "$overlay/sluice/work"

# put HOST GUEST links HOST into the overlay at GUEST.
put() {
  local host guest="$2"
  host="$(readlink -f "$1")" || die "no such file: $1"
  [ -e "$host" ] || die "no such file: $1"
  [[ "$guest" == /* ]] || die "guest path must be absolute: $guest"
  mkdir -p "${overlay}$(dirname "$guest")"
  rm -rf "${overlay}${guest}"
  ln -s "$host" "${overlay}${guest}"
}

# build_suites compiles the default suites (those named in $SLUICE_VM_SUITES, when set) and
# writes their runner; it prints go-test-style "ok"/"FAIL" lines per suite so CI logs read
# like `go test` (the package, followed by the suite's flags when it has any).
build_suites() {
  local t0; t0="$(now)"
  local runner="$overlay/sluice/run.sh" spec name pkg tags flags rel bin label env floor conformance=0
  local -A built=()
  {
    echo 'set -o pipefail'
    printf 'export SLUICE_REQUIRE=%q\n' "$VM_REQUIRE"
    echo 'rc=0'
    echo 'suite() {'
    echo '  local label=$1 floor=$2 dir=$3 t0=$EPOCHREALTIME s; shift 3'
    echo '  (cd "$dir" && "$@") 2>&1 | testcount -text -tier "$label" -floor "$floor"; s=$?'
    echo '  local dt; dt=$(awk -v a="$t0" -v b="$EPOCHREALTIME" '"'"'BEGIN { printf "%.3f", b - a }'"'"')'
    echo '  if [ "$s" = 0 ]; then printf "ok  \t%s\t%ss\n" "$label" "$dt"; else printf "FAIL\t%s\t%ss\n" "$label" "$dt"; rc=1; fi'
    echo '}'
  } >"$runner"
  for spec in "${SUITES[@]}"; do
    read -r name pkg tags flags <<<"$spec"
    if [ -n "${SLUICE_VM_SUITES:-}" ] && [[ " ${SLUICE_VM_SUITES} " != *" ${name} "* ]]; then
      continue
    fi
    [ -n "${SUITE_FLOOR[$name]:-}" ] || die "suite ${name} has no floor in SUITE_FLOOR"
    floor="${SUITE_FLOOR[$name]}"
    [ -z "${SLUICE_VM_TESTFLAGS:-}" ] || floor=0
    rel="${pkg#./}"
    bin="/sluice/bin/${rel//\//-}.${tags}.test"
    if [ -z "${built[$bin]:-}" ]; then
      log "building ${pkg} (-tags ${tags})"
      (cd "$ROOT" && CGO_ENABLED=0 go test -c -tags "$tags" -o "$tmp$bin" "$pkg") ||
        die "building test binary for ${pkg} failed"
      [ -x "$tmp$bin" ] || die "${pkg} has no tests with tags ${tags}"
      put "$tmp$bin" "$bin"
      mkdir -p "$overlay/sluice/src/$rel"
      [ -d "$ROOT/$rel/testdata" ] && put "$ROOT/$rel/testdata" "/sluice/src/$rel/testdata"
      built[$bin]=1
    fi
    label="${MODULE_PATH}/${rel}${flags:+ ${flags}}"
    env=()
    if [ "$tags" = conformance ]; then
      conformance=1
      env=(env "${conformance_env[@]}")
    fi
    # shellcheck disable=SC2086 # flags and SLUICE_VM_TESTFLAGS are lists of flags
    printf 'suite %q %q %q%s %q -test.v -test.timeout=%q%s%s\n' "$label" "$floor" "/sluice/src/$rel" \
      "$(for e in ${env[@]+"${env[@]}"}; do printf ' %q' "$e"; done)" \
      "$bin" "${SLUICE_VM_TEST_TIMEOUT:-20m}" \
      "$(for f in ${flags}; do printf ' %q' "$f"; done)" \
      "$(for f in ${SLUICE_VM_TESTFLAGS:-}; do printf ' %q' "$f"; done)" >>"$runner"
  done
  echo 'exit $rc' >>"$runner"
  (cd "$ROOT" && CGO_ENABLED=0 go build -o "$tmp/bin/testcount" ./hack/testcount) || die "building hack/testcount failed"
  put "$tmp/bin/testcount" /sluice/bin/testcount
  if [ "$conformance" = 1 ]; then prepare_conformance; fi
  log "test binaries built ($(since "$t0")s)"
}

# The environment of the conformance suites in the guest (test/conformance/README.md). The
# cases mostly wait for packets, so many run at once (-test.parallel); their results go to
# the results share.
conformance_env=(
  SLUICE_BIN=/sluice/bin/sluice
  SLUICE_ECHOSERVER=/sluice/bin/echoserver
  KUBE_PROXY_BIN=/sluice/bin/kube-proxy
  KUBE_APISERVER=/opt/control-plane/kube-apiserver
  ETCD=/opt/control-plane/etcd
  "SLUICE_CONFORMANCE_READY_TIMEOUT=${CONFORMANCE_READY_TIMEOUT}"
  "SLUICE_CONFORMANCE_APISERVER_FLAGS=${CONFORMANCE_APISERVER_FLAGS}"
  "SLUICE_CONFORMANCE_CONVERGE_TIMEOUT=${SLUICE_CONFORMANCE_CONVERGE_TIMEOUT:-90s}"
  SLUICE_CONFORMANCE_RESULTS=/sluice/results
)

# prepare_conformance puts into the guest what the conformance suites run: sluice and the
# echo server built from this tree, upstream kube-proxy (static, like sluice), and the
# control plane (copied into the initramfs, not shared over 9p: see "Passing the
# control-plane binaries" in hack/vm/README.md).
prepare_conformance() {
  log "building sluice and the echo server"
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -o "$tmp/bin/sluice" ./cmd/sluice &&
    CGO_ENABLED=0 go build -trimpath -o "$tmp/bin/echoserver" ./test/echoserver) ||
    die "building sluice or the echo server failed"
  put "$tmp/bin/sluice" /sluice/bin/sluice
  put "$tmp/bin/echoserver" /sluice/bin/echoserver
  local kube_proxy="${KUBE_PROXY_BIN:-}"
  if [ -z "$kube_proxy" ]; then
    kube_proxy="$("$ROOT/hack/kube-proxy-reference.sh")" || die "building upstream kube-proxy failed"
  fi
  put "$kube_proxy" /sluice/bin/kube-proxy
  local apiserver="${KUBE_APISERVER:-}" etcd="${ETCD:-}"
  if [ -z "$apiserver" ] || [ -z "$etcd" ]; then
    local line
    while IFS= read -r line; do
      case "$line" in
        KUBE_APISERVER=*) [ -n "$apiserver" ] || apiserver="${line#KUBE_APISERVER=}" ;;
        ETCD=*) [ -n "$etcd" ] || etcd="${line#ETCD=}" ;;
      esac
    done < <("$ROOT/hack/control-plane.sh" --env) || die "hack/control-plane.sh failed"
  fi
  [ -x "$apiserver" ] && [ -x "$etcd" ] || die "no kube-apiserver or etcd (${apiserver:-unset}, ${etcd:-unset}); run make control-plane"
  put "$apiserver" /opt/control-plane/kube-apiserver
  put "$etcd" /opt/control-plane/etcd
}

# ---------------------------------------------------------------------------------------------

read -r kpkg kversion < <(resolve_kernel)
kdir="$(fetch_kernel "$kpkg" "$kversion")"
kver="$(cat "$kdir/release")"

results_dir=""
if [ ${#cmd[@]} -eq 0 ]; then
  if [ -n "${SLUICE_VM_ARTIFACTS:-}" ]; then
    # The conformance suites keep every process log there (read-write 9p share).
    mkdir -p "$SLUICE_VM_ARTIFACTS"
    shares+=("${SLUICE_VM_ARTIFACTS}:/sluice/artifacts:rw")
    conformance_env+=(SLUICE_TEST_ARTIFACTS=/sluice/artifacts)
    results_dir="${SLUICE_VM_ARTIFACTS}/results"
  else
    results_dir="${tmp}/results"
  fi
  # The conformance suites' results come back over a read-write share.
  rm -rf "$results_dir" && mkdir -p "$results_dir"
  shares+=("${results_dir}:/sluice/results:rw")
  build_suites
else
  printf '%q ' "${cmd[@]}" >"$overlay/sluice/run.sh"
  echo >>"$overlay/sluice/run.sh"
fi

for spec in ${files[@]+"${files[@]}"}; do
  src="${spec%%:*}"
  if [[ "$spec" == *:* ]]; then dst="${spec#*:}"; else dst="/sluice/work/$(basename "$src")"; fi
  put "$src" "$dst"
done

i=0
qemu_shares=()
: >"$overlay/sluice/mounts"
for spec in ${shares[@]+"${shares[@]}"}; do
  IFS=: read -r src dst mode <<<"$spec"
  [ -d "$src" ] || die "--share: ${src} is not a directory"
  [[ "$dst" == /* ]] || die "--share: guest path must be absolute: ${dst}"
  tag="sluice${i}"
  if [ "${mode:-ro}" = rw ]; then
    qemu_shares+=(-virtfs "local,path=$(readlink -f "$src"),mount_tag=${tag},security_model=none,id=${tag}")
    echo "${tag} ${dst} rw,cache=mmap" >>"$overlay/sluice/mounts"
  else
    qemu_shares+=(-virtfs "local,path=$(readlink -f "$src"),mount_tag=${tag},security_model=none,id=${tag},readonly=on")
    echo "${tag} ${dst} ro,cache=loose" >>"$overlay/sluice/mounts"
  fi
  i=$((i + 1))
done

nonce="$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
marker="SLUICE-VM-EXIT-STATUS-${nonce}"
echo "$marker" >"$overlay/sluice/marker"

t_build="$(now)"
base_cpio="$(cached_base "$kdir")"
(cd "$overlay" && find -L . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 -L --quiet) >"$tmp/overlay.cpio"
cat "$base_cpio" "$tmp/overlay.cpio" >"$tmp/initramfs.cpio"
rm -f "$tmp/overlay.cpio"
log "initramfs $(( $(stat -c %s "$tmp/initramfs.cpio") / 1048576 )) MiB ready ($(since "$t_build")s)"

kernel_image="$kdir/vmlinux"
[ -f "$kernel_image" ] || kernel_image="$kdir/vmlinuz"
accel="${SLUICE_VM_ACCEL:-tcg}"
bios=()
# qboot is a minimal firmware: it boots a -kernel image faster than SeaBIOS and prints nothing.
[ -f /usr/share/qemu/qboot.rom ] && bios=(-bios /usr/share/qemu/qboot.rom)

qemu_args=(
  -machine pc -accel "$accel" -m "$memory" -smp "$cpus"
  "${bios[@]}"
  -nographic -no-reboot -nic none -vga none
  -device virtio-rng-pci
  ${qemu_shares[@]+"${qemu_shares[@]}"}
  -kernel "$kernel_image" -initrd "$tmp/initramfs.cpio"
  # quiet: only warnings on the console. mitigations=off: page-table isolation and friends
  # only slow a throwaway guest down (every CR3 switch flushes TCG's soft TLB).
  # rcu_expedited: module loading and netns teardown wait for RCU grace periods, which take
  # many emulated ticks under TCG; expedited grace periods cut the module loading by a third.
  # no_timer_check: the boot-time check that the IO-APIC timer ticks fails when the host is
  # busy and the emulated CPU falls behind ("IO-APIC + timer doesn't work!", a panic); the
  # emulated timer works, only its measurement does not.
  -append "console=ttyS0 panic=-1 quiet mitigations=off rcupdate.rcu_expedited=1 no_timer_check rdinit=/init sluice.vm=1 ${SLUICE_VM_APPEND:-}"
)

log "booting ${kver} (${accel}, ${cpus} vCPUs, ${memory} MiB, timeout ${timeout_s}s)"
mkfifo "$tmp/console"
t_boot="$(now)"
timeout -k 10 "$timeout_s" qemu-system-x86_64 "${qemu_args[@]}" </dev/null >"$tmp/console" 2>&1 &
qemu_pid=$!

status=""
t_ready=""
while IFS= read -r line; do
  line="${line%$'\r'}"
  line="${line//$'\e'[\[]*([0-9;?])[a-zA-Z]/}"
  line="${line//$'\e'c/}"
  printf '%s\n' "$line" >>"$tmp/console.log"
  if [[ "$line" == "${marker}="* ]]; then
    status="${line#"${marker}="}"
    continue
  fi
  [ -n "$status" ] && continue # the kernel's power-off chatter
  if [ -z "$t_ready" ] && [[ "$line" == "sluice-vm: kernel "* ]]; then t_ready="$(now)"; fi
  printf '%s\n' "$line"
done <"$tmp/console"

qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
qemu_pid=""

boot="n/a"; [ -n "$t_ready" ] && boot="$(awk -v a="$t_boot" -v b="$t_ready" 'BEGIN { printf "%.1f", b - a }')"
if [[ "$status" =~ ^[0-9]+$ ]]; then
  log "guest exit status ${status}; boot to command ${boot}s, VM ${kver} ran $(since "$t_boot")s, total $(since "$t_start")s"
  # Compare sluice's conformance outcomes with upstream's (and the capability table's ipvs
  # column with sluice's), from what the suites wrote to the results share.
  if [ -n "$results_dir" ] && ls "$results_dir"/*.json >/dev/null 2>&1; then
    # -reference=false: no upstream ipvs run here (see SUITES); the modes that have one are
    # still compared.
    (cd "$ROOT" && go run ./test/conformance/checkresults -reference=false "$results_dir") || { [ "$status" != 0 ] || status=1; }
  elif [ -n "$results_dir" ] && grep -q '/sluice/results' "$overlay/sluice/run.sh"; then
    log "the conformance suites wrote no results"
    [ "$status" != 0 ] || status=1
  fi
  exit "$status"
fi
if [ "$qemu_rc" = 124 ]; then
  log "timed out after ${timeout_s}s (boot to command ${boot}s); raise --timeout or look for a hung test"
  exit 124
fi
log "the VM stopped without reporting an exit status (qemu status ${qemu_rc}); last console lines:"
tail -n 30 "$tmp/console.log" >&2 || true
exit 125
