//go:build vm

// Checks of the test VM itself, run inside it by `hack/ipvs-vm.sh` (its default suites build
// this package with -tags vm). They pin down what the tests and, later, the conformance suite
// rely on: the node-like environment /init prepares, the modules of hack/vm/modules.list, and
// working iptables (both flavours) and ipset userspace. Each check that changes anything does it
// in a named network namespace of its own.
package vm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/test/netnstest"
)

func TestMain(m *testing.M) {
	if !InGuest() {
		// Built with -tags vm only for the VM; outside it every check here would be wrong.
		_, _ = os.Stderr.WriteString("test/vm: these tests check the test VM; run them via hack/ipvs-vm.sh\n")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func TestGuestHasTheHostnameAndFilesystemsANodeHas(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || host != "sluice-vm" {
		t.Errorf("hostname = %q, %v; want sluice-vm", host, err)
	}
	for _, dir := range []string{"/dev/shm", "/tmp", "/run"} {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Errorf("statfs %s: %v", dir, err)
			continue
		}
		if st.Type != unix.TMPFS_MAGIC {
			t.Errorf("%s has filesystem type %#x, want tmpfs", dir, st.Type)
		}
		f, err := os.CreateTemp(dir, "probe")
		if err != nil {
			t.Errorf("%s is not writable: %v", dir, err)
			continue
		}
		_ = f.Close()
		_ = os.Remove(f.Name())
	}
	if st, err := os.Stat("/run/netns"); err != nil || !st.IsDir() {
		t.Errorf("/run/netns: %v; want a directory", err)
	}
}

func TestGuestHasEntropyWithoutWaiting(t *testing.T) {
	buf := make([]byte, 32)
	if _, err := unix.Getrandom(buf, unix.GRND_NONBLOCK); err != nil {
		t.Fatalf("getrandom(GRND_NONBLOCK): %v; the guest's random pool is not initialised (virtio-rng missing?)", err)
	}
}

func TestGuestLoadedEveryBootModule(t *testing.T) {
	data, err := os.ReadFile(ModulesList)
	if err != nil {
		t.Fatal(err)
	}
	mods := BootModules(string(data))
	if len(mods) == 0 {
		t.Fatalf("%s names no modules to load", ModulesList)
	}
	for _, m := range mods {
		// Module names use underscores in sysfs whatever the file name says.
		if _, err := os.Stat(filepath.Join("/sys/module", strings.ReplaceAll(m, "-", "_"))); err != nil {
			t.Errorf("module %s is not loaded: %v", m, err)
		}
	}
}

func TestGuestWritesSysctlsInANamespace(t *testing.T) {
	ns := netnstest.NewNamed(t, "vm-sysctl")
	netnstest.MustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	got := strings.TrimSpace(netnstest.MustRun(t, "ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.ip_forward"))
	if got != "1" {
		t.Errorf("net.ipv4.ip_forward in %s = %q after writing 1", ns, got)
	}
	// br_netfilter is loaded, so bridged traffic can be made to traverse iptables.
	if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil {
		t.Errorf("br_netfilter's sysctls are missing: %v", err)
	}
}

func TestGuestCreatesTheLinksAndSocketsTestsUse(t *testing.T) {
	ns := netnstest.NewNamed(t, "vm-links")
	for _, args := range [][]string{
		{"-n", ns, "link", "add", "kube-ipvs0", "type", "dummy"},
		{"-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"},
		{"-n", ns, "link", "add", "br0", "type", "bridge"},
	} {
		netnstest.MustRun(t, "ip", args...)
	}
	err := netnstest.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
		if err == nil {
			_ = unix.Close(fd)
		}
		return err
	})
	if err != nil {
		t.Errorf("opening an SCTP socket: %v", err)
	}
}

func TestGuestRunsIptablesOfBothFlavoursAndIpset(t *testing.T) {
	ns := netnstest.NewNamed(t, "vm-iptables")
	in := func(args ...string) string {
		t.Helper()
		return netnstest.MustRun(t, "ip", append([]string{"netns", "exec", ns}, args...)...)
	}
	// A rule with the matches kube-proxy's iptables and IPVS modes use; the nft flavour runs them
	// through nft_compat, the legacy one through x_tables.
	rule := []string{"-t", "nat", "-A", "SLUICE-VM-CHECK", "-m", "comment", "--comment", "vm check",
		"-m", "addrtype", "--dst-type", "LOCAL", "-m", "statistic", "--mode", "random", "--probability", "0.5",
		"-j", "MASQUERADE"}
	for _, flavour := range []string{"nft", "legacy"} {
		for _, family := range []string{"iptables", "ip6tables"} {
			bin := family + "-" + flavour
			in(bin, "-t", "nat", "-N", "SLUICE-VM-CHECK")
			in(append([]string{bin}, rule...)...)
			if saved := in(bin + "-save"); !strings.Contains(saved, `--comment "vm check"`) {
				t.Errorf("%s-save does not show the rule:\n%s", bin, saved)
			}
		}
	}
	in("ipset", "create", "SLUICE-VM-CHECK", "hash:ip,port,ip")
	in("ipset", "add", "SLUICE-VM-CHECK", "10.244.1.2,tcp:8080,10.244.1.2")
	in("iptables-nft", "-t", "filter", "-A", "INPUT", "-m", "set", "--match-set", "SLUICE-VM-CHECK", "dst,dst,src", "-j", "ACCEPT")
	if out := in("ipset", "list", "SLUICE-VM-CHECK"); !strings.Contains(out, "10.244.1.2,tcp:8080,10.244.1.2") {
		t.Errorf("ipset list lacks the entry:\n%s", out)
	}
	in("conntrack", "-L")
}

func TestGuestMountsNinePShares(t *testing.T) {
	// hack/ipvs-vm.sh --share relies on these; the harness test (-tags vmharness) mounts one.
	data, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "\t9p\n") {
		t.Errorf("the guest kernel cannot mount 9p:\n%s", data)
	}
}

func TestGuestClockAdvances(t *testing.T) {
	// A guest whose timers stall under TCG would make every timeout in the suites lie.
	start := time.Now()
	time.Sleep(100 * time.Millisecond)
	if elapsed := time.Since(start); elapsed < 100*time.Millisecond || elapsed > 5*time.Second {
		t.Errorf("sleeping 100ms took %v", elapsed)
	}
}
