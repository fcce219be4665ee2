package netnstest

import (
	"net/netip"
	"os/exec"
	"testing"
)

// Veth joins namespace ns to this process's namespace (the test's node) with a veth pair:
// hostIf on the node, holding hostAddr ("10.1.1.1/24"), and eth0 in ns, holding nsAddrs;
// both ends up, and ns's default route via hostAddr's address. IPv6 addresses skip
// duplicate address detection (nodad), so that they are usable at once. The node's end is
// deleted when the test ends (deleting ns deletes it too, but a test may fail before).
func Veth(t testing.TB, ns, hostIf, hostAddr string, nsAddrs ...string) {
	t.Helper()
	gateway := netip.MustParsePrefix(hostAddr).Addr()
	MustRun(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	MustRun(t, "ip", addrAdd("", hostAddr, hostIf)...)
	MustRun(t, "ip", "link", "set", hostIf, "up")
	for _, a := range nsAddrs {
		MustRun(t, "ip", addrAdd(ns, a, "eth0")...)
	}
	MustRun(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	MustRun(t, "ip", "-n", ns, "route", "add", "default", "via", gateway.String())
}

// addrAdd is the `ip` command line adding prefix to dev, in namespace ns ("" for the node).
func addrAdd(ns, prefix, dev string) []string {
	var args []string
	if ns != "" {
		args = append(args, "-n", ns)
	}
	args = append(args, "addr", "add", prefix, "dev", dev)
	if netip.MustParsePrefix(prefix).Addr().Is6() {
		args = append(args, "nodad")
	}
	return args
}
