// Package topology builds a small cluster out of network namespaces, with plain `ip`
// commands, for tests that need real packets to cross real nodes: two (or more) node
// namespaces with a pod bridge and pod namespaces behind veths, an underlay bridge joining
// the nodes and an external client, and a link from each node to the namespace the test runs
// in, where the kube-apiserver listens.
//
//	   test's namespace: bridge slct<run>br 169.254.N.1/24 (apiserver listens here)
//	      │ veth                           │ veth
//	   api0 169.254.N.10                api0 169.254.N.11
//	┌─ node-a ──────────────┐       ┌─ node-b ──────────────┐
//	│ cbr0 10.244.1.1/24    │       │ cbr0 10.244.2.1/24    │
//	│  ├ a0 10.244.1.10     │       │  ├ b0 10.244.2.10     │
//	│  └ a1 10.244.1.11     │       │  └ b1 10.244.2.11     │
//	│ eth0 172.18.0.2/24    │       │ eth0 172.18.0.3/24    │
//	└──────────┬────────────┘       └──────────┬────────────┘
//	           └───── underlay: br0 172.18.0.1/24 ────┘
//	                           │
//	                external: eth0 172.18.0.100/24 (+ .101, ...)
//
// With Options.IPv6 every host also has an IPv6 address: underlay fd00:172:18::/64 (the
// gateway ::1, nodes ::2, ::3, the external client ::64, ::65, ...), pods
// fd00:10:244:<node>::/64 (bridge ::1, pods ::a, ::b). With Options.SecondaryUnderlay each
// node's eth0 has a second address in 172.18.1.0/24 (fd00:172:19::/64), .2, .3, ..., which
// the external client reaches from its own 172.18.1.100 (fd00:172:19::64).
//
// The underlay's gateway forwards nothing and answers nothing: a packet that leaves a node
// for an address no host has (a ClusterIP nothing claims, say) is silently dropped, in both
// families, so the client sees a timeout, never a rate-limited mix of timeouts and "host
// unreachable".
//
// Several topologies can share one apiserver bridge (Options.APIOf): their nodes join the
// first topology's bridge with addresses of their own, so that one control plane serves
// them all.
//
// Every name carries the run's id (slct-<pid>-<seq>), so runs in parallel never collide,
// and everything is deleted in t.Cleanup even when the test fails. Teardown removes what a
// crashed run left behind: namespaces and links whose owning process is gone. In the test's
// own namespace only the bridge and veths this package creates are touched, never other
// routes, rules or sysctls.
package topology

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

// Options shape a Cluster. The zero value gives two nodes with two pods each, IPv4 only,
// and one external client address.
type Options struct {
	// Nodes is the number of node namespaces (node-a, node-b, ...); default 2, at most 9.
	Nodes int
	// PodsPerNode is the number of pod namespaces on each node (a0, a1, ...); default 2.
	PodsPerNode int
	// IPv6 adds IPv6 addresses and routes everywhere (dual-stack).
	IPv6 bool
	// ExternalAddresses is the number of IPv4 (and IPv6) addresses of the external client,
	// to test source-range filtering with more than one source; default 1.
	ExternalAddresses int
	// SecondaryUnderlay gives every node a second underlay address, in another subnet
	// (Node.SecondaryIPs), and the external client an address in that subnet
	// (Cluster.ExternalSecondaryIPs): a node address outside the primary subnet, to test
	// nodePortAddresses.
	SecondaryUnderlay bool
	// APIOf, when set, attaches this topology's nodes to the apiserver bridge of another
	// topology instead of creating one: one control plane then serves both. APIOf must
	// outlive this topology (create it first: cleanups run in reverse).
	APIOf *Cluster
	// LogDir receives one log file per started process. Default: $SLUICE_TEST_ARTIFACTS/<id>
	// when that is set, else a temporary directory. It is removed when the test passes and
	// kept (and named in the test log) when it fails.
	LogDir string
}

// Cluster is a built topology. Fields are read-only.
type Cluster struct {
	// ID is the run's unique name prefix, slct-<pid>-<seq>.
	ID string
	// Underlay is the namespace holding the bridge that joins nodes and the external client.
	Underlay string
	// APIBridge is the bridge in the test's namespace and APIPrefix its address: the
	// kube-apiserver binds APIPrefix.Addr().
	APIBridge string
	APIPrefix netip.Prefix
	Nodes     []*Node
	// External is the client outside the cluster, on the underlay.
	External *Host
	// ExternalIPs are all the external client's addresses (External.IPv4 is the first).
	ExternalIPs []netip.Addr
	// ExternalSecondaryIPs are the external client's addresses in the secondary underlay
	// subnet (Options.SecondaryUnderlay), IPv4 first.
	ExternalSecondaryIPs []netip.Addr
	// LogDir holds the process logs.
	LogDir string

	linkTag   string // prefix of every link this run creates in the test's namespace
	apiSlot   int    // which block of addresses on the apiserver bridge this run's nodes use
	apiUsers  atomic.Int32
	names     map[netip.Addr]string // every address of the topology, by AddressName
	mu        sync.Mutex
	processes []*Process
}

// Host is one network namespace with addresses: a node, a pod or the external client.
type Host struct {
	// Name is the logical name: node-a, a0, external.
	Name string
	// NetNS is the `ip netns` name.
	NetNS string
	// IPv4 and IPv6 are the host's primary addresses (IPv6 invalid unless Options.IPv6).
	IPv4, IPv6 netip.Addr
	c          *Cluster
}

// Node is a node namespace.
type Node struct {
	Host
	// PodCIDRs are the node's pod ranges, IPv4 first.
	PodCIDRs []netip.Prefix
	// Bridge is the pod bridge (cbr0), with the pods' gateway addresses BridgeIPs.
	Bridge    string
	BridgeIPs []netip.Addr
	// APIAddress is the node's address on its link to the test's namespace.
	APIAddress netip.Addr
	// SecondaryIPs are the node's second underlay addresses (Options.SecondaryUnderlay),
	// IPv4 first; nil without.
	SecondaryIPs []netip.Addr
	Pods         []*Pod
}

// Pod is a pod namespace on a node.
type Pod struct {
	Host
	Node *Node
}

// Fixed addressing; see the package comment.
const (
	underlayV4     = "172.18.0"
	underlayV6     = "fd00:172:18::"
	secondaryV4    = "172.18.1"
	secondaryV6    = "fd00:172:19::"
	externalOffset = 100
	podBridge      = "cbr0"
	// ClusterCIDRv4 and ClusterCIDRv6 cover every node's pod CIDR.
	ClusterCIDRv4 = "10.244.0.0/16"
	ClusterCIDRv6 = "fd00:10:244::/48"
)

// namePrefix starts every namespace and link name this package creates.
const namePrefix = "slct"

var runSeq atomic.Int64

// New builds the topology and registers its teardown with t.Cleanup. It first removes
// leftovers of crashed earlier runs (Teardown). It fails t on any error.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.PodsPerNode == 0 {
		opts.PodsPerNode = 2
	}
	if opts.ExternalAddresses == 0 {
		opts.ExternalAddresses = 1
	}
	if opts.Nodes > 9 || opts.PodsPerNode > 50 || opts.ExternalAddresses > 50 {
		t.Fatalf("topology: too large: %+v", opts)
	}
	if err := Teardown(); err != nil {
		t.Logf("topology: removing leftovers of earlier runs: %v", err)
	}
	seq := runSeq.Add(1)
	pid := os.Getpid()
	c := &Cluster{
		ID:      fmt.Sprintf("%s-%d-%d", namePrefix, pid, seq),
		linkTag: fmt.Sprintf("%s%06x%x", namePrefix, pid, seq%16),
	}
	c.Underlay = c.ID + "-underlay"
	c.APIBridge = c.linkTag + "br"
	if opts.APIOf != nil {
		c.APIBridge, c.APIPrefix = opts.APIOf.APIBridge, opts.APIOf.APIPrefix
		c.apiSlot = int(opts.APIOf.apiUsers.Add(1))
		if 10+10*c.apiSlot+opts.Nodes > 250 {
			t.Fatalf("topology: too many topologies on the apiserver bridge of %s", opts.APIOf.ID)
		}
	}

	c.LogDir = opts.LogDir
	if c.LogDir == "" {
		if dir := os.Getenv("SLUICE_TEST_ARTIFACTS"); dir != "" {
			c.LogDir = dir + "/" + c.ID
		} else {
			dir, err := os.MkdirTemp("", c.ID+"-logs-")
			if err != nil {
				t.Fatalf("topology: log dir: %v", err)
			}
			c.LogDir = dir
		}
	}
	if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		t.Fatalf("topology: log dir: %v", err)
	}
	t.Cleanup(func() {
		c.stopAll()
		if err := deleteRun(c.ID, c.linkTag); err != nil {
			t.Errorf("topology: teardown of %s: %v", c.ID, err)
		}
		if t.Failed() {
			t.Logf("topology: process logs kept in %s", c.LogDir)
		} else if opts.LogDir == "" && os.Getenv("SLUICE_TEST_ARTIFACTS") == "" {
			_ = os.RemoveAll(c.LogDir)
		}
	})
	if err := c.build(opts); err != nil {
		t.Fatalf("topology: %v", err)
	}
	t.Logf("topology %s:\n%s", c.ID, c.Describe())
	return c
}

// ip runs one `ip` command.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// script runs `ip` commands in order, stopping at the first failure. Consecutive commands
// in the same namespace run as one `ip [-n NS] -batch -`: under emulation (the IPVS VM) each
// exec of ip costs over half a second, and a topology is built from a hundred commands.
func script(cmds ...[]string) error {
	for i := 0; i < len(cmds); {
		ns, line, ok := batchLine(cmds[i])
		j := i + 1
		lines := []string{line}
		for ok && j < len(cmds) {
			ns2, line2, ok2 := batchLine(cmds[j])
			if !ok2 || ns2 != ns {
				break
			}
			lines = append(lines, line2)
			j++
		}
		if len(lines) == 1 {
			if err := ip(cmds[i]...); err != nil {
				return err
			}
		} else if err := ipBatch(ns, lines); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// batchLine splits an ip command into its namespace ("" for the test's own) and the line
// `ip -batch` reads. Batch lines take no options, so a command with one (-6) runs alone.
func batchLine(args []string) (ns, line string, ok bool) {
	if len(args) >= 3 && args[0] == "-n" {
		ns, args = args[1], args[2:]
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return "", "", false
	}
	return ns, strings.Join(args, " "), true
}

// ipBatch runs lines with `ip -batch -`, in namespace ns unless it is empty.
func ipBatch(ns string, lines []string) error {
	var args []string
	if ns != "" {
		args = append(args, "-n", ns)
	}
	cmd := exec.Command("ip", append(args, "-batch", "-")...)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s -batch (%s): %w: %s", strings.Join(args, " "), strings.Join(lines, "; "), err, bytes.TrimSpace(out))
	}
	return nil
}

func words(s string, a ...any) []string { return strings.Fields(fmt.Sprintf(s, a...)) }

// sysctl applies "key=value" settings inside namespace ns. /proc/sys/net shows the network
// namespace of the thread that opens it, so the files are written from a thread inside ns
// (no dependency on procps' sysctl binary).
func sysctl(ns string, settings ...string) error {
	return netnstest.Do(ns, func() error {
		for _, kv := range settings {
			key, value, _ := strings.Cut(kv, "=")
			path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
			if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
				return fmt.Errorf("sysctl %s in %s: %w", kv, ns, err)
			}
		}
		return nil
	})
}

func (c *Cluster) addNetNS(name string, ipv6 bool) error {
	if err := script(words("netns add %s", name), words("-n %s link set lo up", name)); err != nil {
		return err
	}
	if ipv6 {
		// New interfaces skip duplicate address detection, so addresses are usable at once.
		return sysctl(name, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	}
	return nil
}

func nodeLetter(i int) string { return string(rune('a' + i)) }

func (c *Cluster) build(opts Options) error {
	// The underlay: a plain switch with the nodes' gateway address.
	if err := c.addNetNS(c.Underlay, opts.IPv6); err != nil {
		return err
	}
	// The switch must not run the underlay's own netfilter on bridged frames. The
	// gateway drops whatever is sent to it for another address, without an ICMP error:
	// with forwarding on, a packet that meets a blackhole route is discarded silently
	// (with forwarding off, the kernel answers "host unreachable", rate-limited by a
	// global token bucket, so a client would see either that or a timeout). IPv6 drops at
	// a blackhole route whether or not it forwards.
	if err := sysctl(c.Underlay, "net.bridge.bridge-nf-call-iptables=0", "net.bridge.bridge-nf-call-ip6tables=0",
		"net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.default.send_redirects=0"); err != nil {
		return err
	}
	u := c.Underlay
	cmds := [][]string{
		words("-n %s link add br0 type bridge", u),
		words("-n %s addr add %s.1/24 dev br0", u, underlayV4),
		words("-n %s link set br0 up", u),
		words("-n %s route add blackhole default", u),
	}
	c.name(netip.MustParseAddr(underlayV4+".1"), "gateway")
	if opts.IPv6 {
		cmds = append(cmds,
			words("-n %s addr add %s1/64 dev br0 nodad", u, underlayV6),
			words("-n %s route add blackhole ::/0", u))
		c.name(netip.MustParseAddr(underlayV6+"1"), "gateway")
	}
	if err := script(cmds...); err != nil {
		return err
	}

	if opts.APIOf == nil {
		apiPrefix, err := freeLinkLocalSubnet()
		if err != nil {
			return err
		}
		c.APIPrefix = apiPrefix
		if err := script(
			words("link add %s type bridge", c.APIBridge),
			words("addr add %s dev %s", apiPrefix, c.APIBridge),
			words("link set %s up", c.APIBridge),
		); err != nil {
			return err
		}
	}
	c.name(c.APIPrefix.Addr(), "apiserver")

	for i := range opts.Nodes {
		n, err := c.addNode(i, opts)
		if err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
	}
	// Each node routes every other node's pod CIDRs to that node's underlay address.
	var routes [][]string
	for _, n := range c.Nodes {
		for _, other := range c.Nodes {
			if other == n {
				continue
			}
			routes = append(routes, words("-n %s route add %s via %s", n.NetNS, other.PodCIDRs[0], other.IPv4))
			if opts.IPv6 {
				routes = append(routes, words("-n %s route add %s via %s", n.NetNS, other.PodCIDRs[1], other.IPv6))
			}
		}
	}
	if err := script(routes...); err != nil {
		return err
	}
	return c.addExternal(opts)
}

func (c *Cluster) addNode(i int, opts Options) (*Node, error) {
	name := "node-" + nodeLetter(i)
	n := &Node{
		Host:       Host{Name: name, NetNS: c.ID + "-" + name, c: c},
		Bridge:     podBridge,
		APIAddress: nthAddr(c.APIPrefix, 10+10*c.apiSlot+i),
	}
	n.IPv4 = netip.MustParseAddr(fmt.Sprintf("%s.%d", underlayV4, 2+i))
	n.PodCIDRs = []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i+1))}
	n.BridgeIPs = []netip.Addr{netip.MustParseAddr(fmt.Sprintf("10.244.%d.1", i+1))}
	if opts.IPv6 {
		n.IPv6 = netip.MustParseAddr(fmt.Sprintf("%s%x", underlayV6, 2+i))
		n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i+1)))
		n.BridgeIPs = append(n.BridgeIPs, netip.MustParseAddr(fmt.Sprintf("fd00:10:244:%d::1", i+1)))
	}
	ns := n.NetNS
	if err := c.addNetNS(ns, opts.IPv6); err != nil {
		return nil, err
	}
	settings := []string{"net.ipv4.ip_forward=1",
		// kube-proxy's rules must see bridged pod-to-pod traffic (hairpin, same-node
		// Service traffic), as on a real node with br_netfilter.
		"net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1",
		// A packet for a LoadBalancer IP that arrives before the proxy programs it is
		// forwarded back out of eth0 to the default gateway; the ICMP redirect that
		// would follow teaches the sender to bypass this node for minutes.
		"net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.default.send_redirects=0",
		// Refusals are ICMP errors (REJECT, nft reject), which the kernel rate-limits per
		// client (about one a second after a burst of six). Tests probe the same client
		// many times a second, so a limited refusal would read as a drop.
		"net.ipv4.icmp_ratelimit=0"}
	if opts.IPv6 {
		settings = append(settings, "net.ipv6.conf.all.forwarding=1", "net.ipv6.icmp.ratelimit=0")
	}
	if err := sysctl(ns, settings...); err != nil {
		return nil, fmt.Errorf("%w (is br_netfilter loaded?)", err)
	}

	// Underlay uplink. A default route is needed even though nothing beyond the underlay
	// exists: a socket to a ClusterIP must route somewhere before NAT rewrites it, or
	// connect() fails with "network unreachable". Then the link to the test's namespace
	// (the apiserver), and the pod bridge. The links are made first, so that the commands
	// inside the node run as one batch (script).
	rootEnd := c.linkTag + nodeLetter(i)
	cmds := [][]string{
		words("-n %s link add eth0 type veth peer name %s netns %s", ns, name, c.Underlay),
		words("-n %s link set %s master br0 up", c.Underlay, name),
		words("link add %s type veth peer name api0 netns %s", rootEnd, ns),
		words("link set %s master %s up", rootEnd, c.APIBridge),
		words("-n %s addr add %s/24 dev eth0", ns, n.IPv4),
		words("-n %s link set eth0 up", ns),
		words("-n %s route add default via %s.1", ns, underlayV4),
	}
	if opts.IPv6 {
		cmds = append(cmds,
			words("-n %s addr add %s/64 dev eth0 nodad", ns, n.IPv6),
			words("-n %s route add ::/0 via %s1", ns, underlayV6))
	}
	c.name(n.IPv4, name+"/eth0")
	c.name(n.IPv6, name+"/eth0")
	if opts.SecondaryUnderlay {
		n.SecondaryIPs = []netip.Addr{netip.MustParseAddr(fmt.Sprintf("%s.%d", secondaryV4, 2+i))}
		if opts.IPv6 {
			n.SecondaryIPs = append(n.SecondaryIPs, netip.MustParseAddr(fmt.Sprintf("%s%x", secondaryV6, 2+i)))
		}
		for _, a := range n.SecondaryIPs {
			cmds = append(cmds, secondaryAddrCmd(ns, "eth0", a))
			c.name(a, name+"/eth0-secondary")
		}
	}
	cmds = append(cmds,
		words("-n %s addr add %s/%d dev api0", ns, n.APIAddress, c.APIPrefix.Bits()),
		words("-n %s link set api0 up", ns),
		words("-n %s link add %s type bridge", ns, podBridge),
		words("-n %s addr add %s/24 dev %s", ns, n.BridgeIPs[0], podBridge),
		words("-n %s link set %s up", ns, podBridge))
	if opts.IPv6 {
		cmds = append(cmds, words("-n %s addr add %s/64 dev %s nodad", ns, n.BridgeIPs[1], podBridge))
	}
	if err := script(cmds...); err != nil {
		return nil, err
	}
	c.name(n.APIAddress, name+"/api0")
	for _, a := range n.BridgeIPs {
		c.name(a, name+"/"+podBridge)
	}
	for j := range opts.PodsPerNode {
		p, err := c.addPod(n, j, opts)
		if err != nil {
			return nil, err
		}
		n.Pods = append(n.Pods, p)
	}
	return n, nil
}

func (c *Cluster) addPod(n *Node, j int, opts Options) (*Pod, error) {
	letter := strings.TrimPrefix(n.Name, "node-")
	name := fmt.Sprintf("%s%d", letter, j)
	p := &Pod{Host: Host{Name: name, NetNS: c.ID + "-" + name, c: c}, Node: n}
	p.IPv4 = nthAddr(n.PodCIDRs[0], 10+j)
	if opts.IPv6 {
		p.IPv6 = nthAddr(n.PodCIDRs[1], 10+j)
	}
	if err := c.addNetNS(p.NetNS, opts.IPv6); err != nil {
		return nil, err
	}
	port := fmt.Sprintf("veth%d", j)
	cmds := [][]string{
		words("-n %s link add %s type veth peer name eth0 netns %s", n.NetNS, port, p.NetNS),
		words("-n %s link set %s master %s up", n.NetNS, port, podBridge),
		// As kubelet's bridge plugin does: lets a pod reach itself through its Service.
		words("-n %s link set dev %s type bridge_slave hairpin on", n.NetNS, port),
		words("-n %s addr add %s/24 dev eth0", p.NetNS, p.IPv4),
		words("-n %s link set eth0 up", p.NetNS),
		words("-n %s route add default via %s", p.NetNS, n.BridgeIPs[0]),
	}
	if opts.IPv6 {
		cmds = append(cmds,
			words("-n %s addr add %s/64 dev eth0 nodad", p.NetNS, p.IPv6),
			words("-n %s route add ::/0 via %s", p.NetNS, n.BridgeIPs[1]))
	}
	c.name(p.IPv4, name)
	c.name(p.IPv6, name)
	return p, script(cmds...)
}

func (c *Cluster) addExternal(opts Options) error {
	h := &Host{Name: "external", NetNS: c.ID + "-external", c: c}
	if err := c.addNetNS(h.NetNS, opts.IPv6); err != nil {
		return err
	}
	// The client's routes to virtual IPs (Route) must hold whatever a node says: an ICMP
	// redirect (IPv6 ones cannot be turned off at the sender) would otherwise send it
	// around the node the test chose.
	redirects := []string{"net.ipv4.conf.all.accept_redirects=0", "net.ipv4.conf.default.accept_redirects=0"}
	if opts.IPv6 {
		redirects = append(redirects, "net.ipv6.conf.all.accept_redirects=0", "net.ipv6.conf.default.accept_redirects=0")
	}
	if err := sysctl(h.NetNS, redirects...); err != nil {
		return err
	}
	cmds := [][]string{
		words("-n %s link add eth0 type veth peer name external netns %s", h.NetNS, c.Underlay),
		words("-n %s link set external master br0 up", c.Underlay),
		words("-n %s link set eth0 up", h.NetNS),
	}
	for k := range opts.ExternalAddresses {
		// The first address is "external", the next ones "external-2", "external-3", ...
		name := "external"
		if k > 0 {
			name = fmt.Sprintf("external-%d", k+1)
		}
		a := netip.MustParseAddr(fmt.Sprintf("%s.%d", underlayV4, externalOffset+k))
		cmds = append(cmds, addrCmd(h.NetNS, "eth0", a))
		c.ExternalIPs = append(c.ExternalIPs, a)
		c.name(a, name)
		if opts.IPv6 {
			a6 := netip.MustParseAddr(fmt.Sprintf("%s%x", underlayV6, externalOffset+k))
			add := addrCmd
			if k > 0 {
				add = secondaryAddrCmd // a probe binds it when it means to use it
			}
			cmds = append(cmds, add(h.NetNS, "eth0", a6))
			c.ExternalIPs = append(c.ExternalIPs, a6)
			c.name(a6, name)
			if k == 0 {
				h.IPv6 = a6
			}
		}
	}
	if opts.SecondaryUnderlay {
		c.ExternalSecondaryIPs = []netip.Addr{netip.MustParseAddr(fmt.Sprintf("%s.%d", secondaryV4, externalOffset))}
		if opts.IPv6 {
			c.ExternalSecondaryIPs = append(c.ExternalSecondaryIPs, netip.MustParseAddr(fmt.Sprintf("%s%x", secondaryV6, externalOffset)))
		}
		for _, a := range c.ExternalSecondaryIPs {
			cmds = append(cmds, secondaryAddrCmd(h.NetNS, "eth0", a))
			c.name(a, "external/secondary")
		}
	}
	if err := script(cmds...); err != nil {
		return err
	}
	h.IPv4 = c.ExternalIPs[0]
	c.External = h
	return nil
}

// addrCmd is the ip command that puts a on dev in namespace ns, with the underlay subnets'
// prefix length (/24 for IPv4, /64 for IPv6) and, for IPv6, without duplicate address
// detection.
func addrCmd(ns, dev string, a netip.Addr) []string {
	if a.Is4() {
		return words("-n %s addr add %s/24 dev %s", ns, a, dev)
	}
	return words("-n %s addr add %s/64 dev %s nodad", ns, a, dev)
}

// secondaryAddrCmd is addrCmd for an address that must never be picked as a source by
// itself. IPv4 picks the first address of the subnet a route's gateway is in, so a second
// subnet's address is only used for its own subnet; IPv6 picks among all of an
// interface's addresses by RFC 6724's rules, whose last tie-breaker would pick the newest.
// An IPv6 address with a preferred lifetime of 0 is deprecated: still answered, and used
// when a socket binds it, but never chosen (RFC 6724 rule 3), so masquerading and
// unbound clients keep using the host's primary address.
func secondaryAddrCmd(ns, dev string, a netip.Addr) []string {
	if a.Is4() {
		return addrCmd(ns, dev, a)
	}
	return words("-n %s addr add %s/64 dev %s nodad preferred_lft 0", ns, a, dev)
}

// nthAddr is the n-th address of prefix p (n small).
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// freeLinkLocalSubnet picks a 169.254.N.0/24 that no address or route of the test's
// namespace uses yet, and returns its first address as a prefix (169.254.N.1/24).
func freeLinkLocalSubnet() (netip.Prefix, error) {
	addrs, err := exec.Command("ip", "-4", "-o", "addr", "show").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("ip addr show: %w", err)
	}
	routes, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("ip route show: %w", err)
	}
	used := string(addrs) + string(routes)
	for n := 20; n < 250; n++ {
		if n == 169 { // cloud metadata lives at 169.254.169.254
			continue
		}
		if !strings.Contains(used, fmt.Sprintf("169.254.%d.", n)) {
			return netip.MustParsePrefix(fmt.Sprintf("169.254.%d.1/24", n)), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free 169.254.N.0/24 subnet")
}

// APIAddress is the address the kube-apiserver should bind: every node reaches it.
func (c *Cluster) APIAddress() netip.Addr { return c.APIPrefix.Addr() }

// name records what an address of the topology is called (AddressName).
func (c *Cluster) name(a netip.Addr, name string) {
	if !a.IsValid() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names == nil {
		c.names = map[netip.Addr]string{}
	}
	c.names[a] = name
}

// AddressName says whose address a is, by role rather than by number, so that tests can
// state where a packet came from in words that do not change between topologies: a pod
// ("a0"), a node's interface ("node-a/eth0", "node-a/cbr0", "node-a/api0",
// "node-a/eth0-secondary"), the external client ("external", "external-2",
// "external/secondary"), the underlay's "gateway" or the "apiserver". IPv4 and IPv6
// addresses of one interface share a name. Any other address is returned as it is.
func (c *Cluster) AddressName(a netip.Addr) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.names[a.Unmap()]; ok {
		return n
	}
	return a.String()
}

// Node returns the node with the given logical name (node-a, ...), or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Pod returns the pod with the given logical name (a0, b1, ...), or nil.
func (c *Cluster) Pod(name string) *Pod {
	for _, p := range c.Pods() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Pods lists every pod, node by node.
func (c *Cluster) Pods() []*Pod {
	var out []*Pod
	for _, n := range c.Nodes {
		out = append(out, n.Pods...)
	}
	return out
}

// Describe renders the topology's names and addresses, one host per line.
func (c *Cluster) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  apiserver bridge %s %s (in the test's namespace)\n", c.APIBridge, c.APIPrefix)
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "  %-8s netns=%s ip=%s%s api=%s podCIDRs=%v\n", n.Name, n.NetNS, n.IPv4, v6(n.IPv6), n.APIAddress, n.PodCIDRs)
		for _, p := range n.Pods {
			fmt.Fprintf(&b, "    %-6s netns=%s ip=%s%s\n", p.Name, p.NetNS, p.IPv4, v6(p.IPv6))
		}
	}
	fmt.Fprintf(&b, "  %-8s netns=%s ips=%v\n", c.External.Name, c.External.NetNS, c.ExternalIPs)
	return b.String()
}

func v6(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return "," + a.String()
}

// IPs are the host's primary addresses, IPv4 first.
func (h *Host) IPs() []netip.Addr {
	if h.IPv6.IsValid() {
		return []netip.Addr{h.IPv4, h.IPv6}
	}
	return []netip.Addr{h.IPv4}
}

// IP is the host's primary address of the family of like (IPv4 when like is invalid).
func (h *Host) IP(like netip.Addr) netip.Addr {
	if like.IsValid() && like.Unmap().Is6() {
		return h.IPv6
	}
	return h.IPv4
}

// Do runs fn on a thread inside the host's namespace (netnstest.Do).
func (h *Host) Do(fn func() error) error { return netnstest.Do(h.NetNS, fn) }

// Probe runs echo.Probe from inside the host's namespace.
func (h *Host) Probe(proto echo.Protocol, target netip.AddrPort, opts echo.ProbeOptions) echo.Outcome {
	var out echo.Outcome
	if err := h.Do(func() error {
		out = echo.Probe(context.Background(), proto, target, opts)
		return nil
	}); err != nil {
		return echo.Outcome{Result: echo.Failed, Err: err}
	}
	return out
}

// DialUDP opens a UDP client socket inside the host's namespace; its Send may then be
// called from anywhere and keeps the socket's source port.
func (h *Host) DialUDP(target netip.AddrPort, source netip.Addr) (*echo.UDPClient, error) {
	var c *echo.UDPClient
	err := h.Do(func() (err error) {
		c, err = echo.DialUDP(target, source)
		return err
	})
	return c, err
}

// Run runs a command inside the host's namespace (`ip netns exec`) and returns its
// combined output.
func (h *Host) Run(name string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", h.NetNS, name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s %s: %w: %s", h.Name, name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// Route points dst at via inside the host's namespace, replacing any route to dst. The
// external client uses it to send LoadBalancer and external IPs to a chosen node.
func (h *Host) Route(dst netip.Prefix, via netip.Addr) error {
	fam := "-4"
	if dst.Addr().Is6() {
		fam = "-6"
	}
	return ip("-n", h.NetNS, fam, "route", "replace", dst.String(), "via", via.String())
}

// waitFor polls cond every 50ms until it returns nil or timeout passes, and returns the
// last error.
func waitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
