//go:build kernel

// Kernel tests proving that the kernel under test can do IPVS, and how to tell when it cannot.
// They need a kernel with ip_vs and dummy, which the CI host lacks: run them with
// hack/ipvs-vm.sh (make test-ipvs). On a kernel without IPVS the tests that need it skip, and
// TestKernelSupportsIPVSAgreesWithWhatTheKernelKeeps shows why the probe exists.
//
// Conventions: every test builds its own named network namespaces (netnstest.NewNamed) and
// never touches the namespace it runs in.
//
//	client namespace   192.168.0.10/24, default route via the node
//	node namespace     192.168.0.2/24 towards the client; Service VIP 172.30.0.10/32 on the
//	                   dummy link kube-ipvs0, as kube-proxy's IPVS mode holds its VIPs;
//	                   10.180.N.1/24 towards pod N
//	pod N namespace    10.180.N.2/24, default route via the node, serving TCP on :8080
package ipvs_test

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/dataplane/ipvs"
	"github.com/sluiceproxy/sluice/test/netnstest"
	"github.com/sluiceproxy/sluice/test/require"
	"github.com/sluiceproxy/sluice/test/vm"
)

const (
	dummyName   = "kube-ipvs0"
	serviceVIP  = "172.30.0.10"
	servicePort = 80
	podPort     = 8080
)

// requireIPVS skips a test on a kernel without IPVS, and fails it inside the test VM, where a
// missing IPVS means the VM is broken rather than that the test runs in the wrong place.
func requireIPVS(t *testing.T) {
	t.Helper()
	supported, err := ipvs.KernelSupportsIPVS()
	if err != nil {
		t.Fatalf("probing the kernel for IPVS: %v", err)
	}
	if supported {
		return
	}
	if vm.InGuest() {
		t.Fatalf("the test VM's kernel has no IPVS generic-netlink family; hack/vm/modules.list must load ip_vs")
	}
	require.Feature(t, require.IPVS, false, "kernel has no IPVS; run via hack/ipvs-vm.sh")
}

// ipvsHandle opens an IPVS netlink handle inside the named namespace. IPVS tables are per
// network namespace, so this handle sees only the services of that namespace.
func ipvsHandle(t *testing.T, ns string) *mobyipvs.Handle {
	t.Helper()
	h, err := mobyipvs.New("/run/netns/" + ns)
	if err != nil {
		t.Fatalf("opening an IPVS handle in %s: %v", ns, err)
	}
	t.Cleanup(h.Close)
	return h
}

// netlinkHandle opens a rtnetlink handle inside the named namespace.
func netlinkHandle(t *testing.T, ns string) *netlink.Handle {
	t.Helper()
	nsHandle, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatalf("opening namespace %s: %v", ns, err)
	}
	defer nsHandle.Close()
	// Only rtnetlink: without a list, NewHandleAt also opens XFRM and netfilter sockets and
	// fails with EPROTONOSUPPORT on a kernel without xfrm_user loaded (Debian's, in the VM).
	h, err := netlink.NewHandleAt(nsHandle, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("opening a netlink handle in %s: %v", ns, err)
	}
	t.Cleanup(h.Close)
	return h
}

func tcpService(vip string, port uint16) *mobyipvs.Service {
	return &mobyipvs.Service{
		AddressFamily: syscall.AF_INET,
		Protocol:      syscall.IPPROTO_TCP,
		Address:       net.ParseIP(vip),
		Port:          port,
		SchedName:     mobyipvs.RoundRobin,
		Netmask:       0xffffffff,
	}
}

func masqDestination(ip string, port uint16) *mobyipvs.Destination {
	return &mobyipvs.Destination{
		AddressFamily:   syscall.AF_INET,
		Address:         net.ParseIP(ip),
		Port:            port,
		Weight:          1,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
	}
}

// TestKernelSupportsIPVSAgreesWithWhatTheKernelKeeps runs on every kernel. It writes a virtual
// server with moby/ipvs and reads the table back: on a kernel with IPVS the service is there,
// on one without (the CI host) the write "succeeds" and nothing is kept. The probe must tell the
// two apart, since moby/ipvs's own errors do not.
func TestKernelSupportsIPVSAgreesWithWhatTheKernelKeeps(t *testing.T) {
	supported, err := ipvs.KernelSupportsIPVS()
	if err != nil {
		t.Fatalf("KernelSupportsIPVS: %v", err)
	}
	ns := netnstest.NewNamed(t, "ipvs-trap")
	h := ipvsHandle(t, ns)

	svc := tcpService(serviceVIP, servicePort)
	addErr := h.NewService(svc)
	services, getErr := h.GetServices()

	if supported {
		if addErr != nil || getErr != nil {
			t.Fatalf("kernel has IPVS: NewService = %v, GetServices = %v; want both to succeed", addErr, getErr)
		}
		if len(services) != 1 || !services[0].Address.Equal(svc.Address) || services[0].Port != svc.Port {
			t.Fatalf("kernel has IPVS: read back %s, want exactly %s:%d", describeServices(services), serviceVIP, servicePort)
		}
		t.Logf("kernel has IPVS: the virtual server was written and read back")
		return
	}

	if len(services) != 0 {
		t.Fatalf("KernelSupportsIPVS says no IPVS, yet the kernel keeps %s", describeServices(services))
	}
	if addErr == nil && getErr == nil {
		t.Logf("kernel has no IPVS, and moby/ipvs reported success for NewService and GetServices while " +
			"keeping nothing: its errors cannot be trusted, the generic-netlink family lookup can")
	} else {
		t.Logf("kernel has no IPVS; moby/ipvs reported NewService = %v, GetServices = %v", addErr, getErr)
	}
}

// TestIPVSProbeProgramsAndReadsBackAVirtualServer creates what kube-proxy's IPVS mode keeps in
// a node: the dummy link holding the VIP, a virtual server on it and a masquerading real server,
// and reads all of it back from the kernel.
func TestIPVSProbeProgramsAndReadsBackAVirtualServer(t *testing.T) {
	requireIPVS(t)
	ns := netnstest.NewNamed(t, "ipvs-probe")
	nl := netlinkHandle(t, ns)

	if err := nl.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: dummyName}}); err != nil {
		t.Fatalf("creating dummy link %s: %v", dummyName, err)
	}
	link, err := nl.LinkByName(dummyName)
	if err != nil {
		t.Fatalf("reading back %s: %v", dummyName, err)
	}
	if link.Type() != "dummy" {
		t.Fatalf("%s has type %q, want dummy", dummyName, link.Type())
	}
	vip, _ := netlink.ParseAddr(serviceVIP + "/32")
	if err := nl.AddrAdd(link, vip); err != nil {
		t.Fatalf("adding %s to %s: %v", vip, dummyName, err)
	}

	h := ipvsHandle(t, ns)
	svc := tcpService(serviceVIP, servicePort)
	if err := h.NewService(svc); err != nil {
		t.Fatalf("NewService: %v", err)
	}
	dst := masqDestination("10.180.1.2", podPort)
	if err := h.NewDestination(svc, dst); err != nil {
		t.Fatalf("NewDestination: %v", err)
	}

	services, err := h.GetServices()
	got := onlyOne(t, "GetServices", services, err, describeServices)
	if !got.Address.Equal(svc.Address) || got.Port != svc.Port || got.Protocol != svc.Protocol ||
		got.AddressFamily != svc.AddressFamily || got.SchedName != svc.SchedName {
		t.Errorf("read back service %s, want %s:%d tcp scheduler %s", describeServices(services), serviceVIP, servicePort, svc.SchedName)
	}

	dests, err := h.GetDestinations(got)
	d := onlyOne(t, "GetDestinations", dests, err, func(ds []*mobyipvs.Destination) string {
		return fmt.Sprintf("%d real servers", len(ds))
	})
	if !d.Address.Equal(dst.Address) || d.Port != dst.Port || d.Weight != dst.Weight ||
		d.ConnectionFlags&mobyipvs.ConnFwdMask != mobyipvs.ConnectionFlagMasq {
		t.Errorf("read back real server %s:%d weight %d flags %#x, want %s:%d weight 1 masquerading",
			d.Address, d.Port, d.Weight, d.ConnectionFlags, dst.Address, dst.Port)
	}

	// The kernel's own view, as ipvsadm would print it, agrees.
	table := readProcInNamespace(t, ns, "/proc/net/ip_vs")
	wantVS := fmt.Sprintf("TCP  %08X:%04X rr", ipHex(serviceVIP), servicePort)
	wantRS := fmt.Sprintf("-> %08X:%04X      Masq", ipHex("10.180.1.2"), podPort)
	if !strings.Contains(table, wantVS) || !strings.Contains(table, wantRS) {
		t.Errorf("/proc/net/ip_vs lacks %q or %q:\n%s", wantVS, wantRS, table)
	}
}

// TestIPVSForwardsConnectionsToRealServers sends real TCP connections from a client namespace to
// a VIP held on kube-ipvs0 in a node namespace; IPVS (NAT mode, round robin) must hand them to
// the servers in two pod namespaces, alternating, and carry the replies back.
func TestIPVSForwardsConnectionsToRealServers(t *testing.T) {
	requireIPVS(t)
	client := netnstest.NewNamed(t, "ipvs-client")
	node := netnstest.NewNamed(t, "ipvs-node")
	pods := []string{netnstest.NewNamed(t, "ipvs-pod1"), netnstest.NewNamed(t, "ipvs-pod2")}

	ip := func(args ...string) { t.Helper(); netnstest.MustRun(t, "ip", args...) }

	// client <-> node
	ip("-n", client, "link", "add", "eth0", "type", "veth", "peer", "name", "client0", "netns", node)
	ip("-n", client, "addr", "add", "192.168.0.10/24", "dev", "eth0")
	ip("-n", client, "link", "set", "eth0", "up")
	ip("-n", client, "route", "add", "default", "via", "192.168.0.2")
	ip("-n", node, "addr", "add", "192.168.0.2/24", "dev", "client0")
	ip("-n", node, "link", "set", "client0", "up")

	// node <-> pods
	podIPs := make([]string, len(pods))
	for i, pod := range pods {
		n := i + 1
		nodeSide := fmt.Sprintf("pod%d", n)
		podIPs[i] = fmt.Sprintf("10.180.%d.2", n)
		ip("-n", pod, "link", "add", "eth0", "type", "veth", "peer", "name", nodeSide, "netns", node)
		ip("-n", pod, "addr", "add", podIPs[i]+"/24", "dev", "eth0")
		ip("-n", pod, "link", "set", "eth0", "up")
		ip("-n", pod, "route", "add", "default", "via", fmt.Sprintf("10.180.%d.1", n))
		ip("-n", node, "addr", "add", fmt.Sprintf("10.180.%d.1/24", n), "dev", nodeSide)
		ip("-n", node, "link", "set", nodeSide, "up")
	}
	netnstest.MustRun(t, "ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")

	// The VIP lives on the dummy link, so the node accepts packets for it locally, where IPVS
	// intercepts them (LOCAL_IN) and rewrites the destination to a pod.
	ip("-n", node, "link", "add", dummyName, "type", "dummy")
	ip("-n", node, "addr", "add", serviceVIP+"/32", "dev", dummyName)

	for i, pod := range pods {
		serveName(t, pod, fmt.Sprintf("%s:%d", podIPs[i], podPort), fmt.Sprintf("pod%d", i+1))
	}

	h := ipvsHandle(t, node)
	svc := tcpService(serviceVIP, servicePort)
	if err := h.NewService(svc); err != nil {
		t.Fatalf("NewService: %v", err)
	}
	for _, podIP := range podIPs {
		if err := h.NewDestination(svc, masqDestination(podIP, podPort)); err != nil {
			t.Fatalf("NewDestination %s: %v", podIP, err)
		}
	}

	const connections = 4
	var answers []string
	for range connections {
		answers = append(answers, fetch(t, client, fmt.Sprintf("%s:%d", serviceVIP, servicePort)))
	}
	sort.Strings(answers)
	if got, want := strings.Join(answers, ","), "pod1,pod1,pod2,pod2"; got != want {
		t.Fatalf("%d connections to %s:%d were answered by %s, want %s (round robin over two pods)",
			connections, serviceVIP, servicePort, got, want)
	}

	// IPVS's connection table agrees: each real server holds half the connections (closed ones
	// linger as inactive). The Stats counters would not do: the kernel folds them in from
	// per-CPU counters only every two seconds.
	dests, err := h.GetDestinations(svc)
	if err != nil {
		t.Fatalf("GetDestinations: %v", err)
	}
	perPod := connections / len(pods)
	for _, d := range dests {
		if held := d.ActiveConnections + d.InactiveConnections; held != perPod {
			t.Errorf("real server %s:%d holds %d connections (%d active), want %d",
				d.Address, d.Port, held, d.ActiveConnections, perPod)
		}
	}
}

// serveName listens on addr inside the named namespace and answers every connection with name.
func serveName(t *testing.T, ns, addr, name string) {
	t.Helper()
	netnstest.ServeTCP(t, ns, addr, func(netip.Addr) string { return name })
}

// fetch opens a TCP connection to addr from the named namespace and returns what the server
// sent before closing.
func fetch(t *testing.T, ns, addr string) string {
	t.Helper()
	var reply []byte
	err := netnstest.Do(ns, func() error {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		reply, err = io.ReadAll(conn)
		return err
	})
	if err != nil {
		t.Fatalf("connecting to %s from %s: %v", addr, ns, err)
	}
	return string(reply)
}

// readProcInNamespace reads a /proc/net file as seen from the named namespace.
func readProcInNamespace(t *testing.T, ns, path string) string {
	t.Helper()
	var data []byte
	if err := netnstest.Do(ns, func() error {
		// /proc/net follows the reading thread's namespace through /proc/thread-self.
		var err error
		data, err = os.ReadFile(strings.Replace(path, "/proc/", "/proc/thread-self/", 1))
		return err
	}); err != nil {
		t.Fatalf("reading %s in %s: %v", path, ns, err)
	}
	return string(data)
}

func ipHex(ip string) uint32 {
	v4 := net.ParseIP(ip).To4()
	return uint32(v4[0])<<24 | uint32(v4[1])<<16 | uint32(v4[2])<<8 | uint32(v4[3])
}

// onlyOne returns the one object a read-back (what) returned, and fails the test on an
// error or any other number of objects, which describe writes out.
func onlyOne[T any](t *testing.T, what string, got []T, err error, describe func([]T) string) T {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(got) != 1 {
		t.Fatalf("%s read back %s, want one", what, describe(got))
	}
	return got[0]
}

func describeServices(services []*mobyipvs.Service) string {
	if len(services) == 0 {
		return "no services"
	}
	parts := make([]string, len(services))
	for i, s := range services {
		parts[i] = fmt.Sprintf("%s:%d proto %d scheduler %q", s.Address, s.Port, s.Protocol, s.SchedName)
	}
	return strings.Join(parts, "; ")
}
