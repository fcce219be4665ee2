package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// This file turns the model into rules. It is pure: no I/O, no clock, no globals. The rule
// text is upstream kube-proxy's (pkg/proxy/iptables), rule for rule and comment for comment,
// so that the two can replace each other on a node; see README.md for the layout.

// nfacct counter names, upstream's.
const (
	nfacctInvalidDropped  = "ct_state_invalid_dropped_pkts"
	nfacctLocalhostAccept = "localhost_nps_accepted_pkts"
)

// largeClusterEndpoints is upstream's threshold: above this many endpoints the per-endpoint
// comments are left out, which makes the ruleset about 40% smaller.
const largeClusterEndpoints = 1000

// renderConfig is everything besides the Services themselves that decides the rules.
type renderConfig struct {
	family model.IPFamily
	// mark is the masquerade mark, e.g. "0x004000".
	mark          string
	masqueradeAll bool
	// ifLocal and ifNotLocal match traffic from pods on this node (the LocalDetector);
	// both are nil when the detector is a no-op.
	ifLocal, ifNotLocal []string
	// localhostNodePorts is true when NodePorts answer on 127.0.0.0/8 (IPv4 only).
	localhostNodePorts bool
	// nodePortMatchAll sends every local destination to KUBE-NODEPORTS; otherwise only
	// nodePortIPs (the local addresses inside nodePortAddresses) do.
	nodePortMatchAll bool
	nodePortIPs      []netip.Addr
	// nodeIP is the node's primary IP of the family: when a loadBalancerSourceRange contains
	// it, the LoadBalancer IPs themselves are allowed as sources (hairpin through a VIP that
	// is a local address).
	nodeIP netip.Addr
	// largeCluster leaves per-endpoint comments out.
	largeCluster bool
	// tcpLiberal is set when nf_conntrack_tcp_be_liberal is on: no INVALID drop rule then.
	tcpLiberal bool
	// nfacct is set when the nfacct counters exist.
	nfacct bool
	// faulty, in tests only, names Services that get one extra rule the kernel rejects
	// (MASQUERADE outside POSTROUTING), to prove failure isolation against a real kernel.
	faulty func(types.NamespacedName, []*model.ServicePort) bool
}

// newRenderConfig resolves a dataplane.Config for one sync.
func newRenderConfig(cfg dataplane.Config, node model.NodeInfo, localAddrs []netip.Addr, tcpLiberal, nfacct bool, totalEndpoints int) *renderConfig {
	rc := &renderConfig{
		family:             cfg.Family,
		mark:               masqueradeMark(cfg.MasqueradeBit),
		masqueradeAll:      cfg.MasqueradeAll,
		localhostNodePorts: localhostNodePortsActive(cfg),
		nodePortMatchAll:   cfg.NodePortAddresses.MatchAll,
		largeCluster:       totalEndpoints > largeClusterEndpoints,
		tcpLiberal:         tcpLiberal,
		nfacct:             nfacct,
	}
	rc.ifLocal, rc.ifNotLocal = detectorArgs(cfg.LocalDetector)
	if ips := node.IPsOf(cfg.Family); len(ips) > 0 {
		rc.nodeIP = ips[0]
	}
	if !rc.nodePortMatchAll {
		for _, a := range localAddrs {
			if model.FamilyOf(a) != cfg.Family {
				continue
			}
			for _, c := range cfg.NodePortAddresses.CIDRs {
				if c.Contains(a) {
					rc.nodePortIPs = append(rc.nodePortIPs, a)
					break
				}
			}
		}
		slices.SortFunc(rc.nodePortIPs, func(a, b netip.Addr) int { return a.Compare(b) })
		rc.nodePortIPs = slices.Compact(rc.nodePortIPs)
	}
	return rc
}

// localhostNodePortsActive reports whether NodePorts answer on 127.0.0.0/8: IPv4 only, the
// option on, and nodePortAddresses covering loopback (upstream's ContainsIPv4Loopback).
func localhostNodePortsActive(cfg dataplane.Config) bool {
	if cfg.Family != model.IPv4 || !cfg.LocalhostNodePorts {
		return false
	}
	if cfg.NodePortAddresses.MatchAll {
		return true
	}
	for _, c := range cfg.NodePortAddresses.CIDRs {
		if c.Addr().Is4() && c.Contains(netip.MustParseAddr("127.0.0.1")) {
			return true
		}
	}
	return false
}

// detectorArgs returns the matches for "from a local pod" and "not from a local pod".
// Upstream's CIDR detectors take one CIDR per family; with several, the first is used.
func detectorArgs(d dataplane.LocalDetector) (ifLocal, ifNotLocal []string) {
	if d.IsNoOp() {
		return nil, nil
	}
	switch d.Mode {
	case dataplane.DetectLocalClusterCIDR, dataplane.DetectLocalNodeCIDR:
		c := d.CIDRs[0].String()
		return []string{"-s", c}, []string{"!", "-s", c}
	case dataplane.DetectLocalBridgeInterface:
		return []string{"-i", d.Interface}, []string{"!", "-i", d.Interface}
	case dataplane.DetectLocalInterfaceNamePrefix:
		return []string{"-i", d.Interface + "+"}, []string{"!", "-i", d.Interface + "+"}
	}
	return nil, nil
}

// topRule is one rule of a Service in one of the shared top-level chains (KUBE-SERVICES,
// KUBE-NODEPORTS, ...). Its spec is kept verbatim: a partial sync deletes it with `-D` and
// the same spec.
type topRule struct {
	chain string
	spec  string
}

// chainRules is one per-Service chain with its rules (full "-A CHAIN ..." lines).
type chainRules struct {
	name  string
	rules []string
}

// serviceRules is everything one Service (all its ports) contributes to the ruleset.
type serviceRules struct {
	name types.NamespacedName
	// ports are the model's ports the rules were rendered from.
	ports     []*model.ServicePort
	natTop    []topRule
	filterTop []topRule
	natChains []chainRules
	// noLocalInternal and noLocalExternal count ports with a Local policy and no local
	// endpoints (the sync_proxy_rules_no_local_endpoints_total gauge).
	noLocalInternal, noLocalExternal int
}

// natRuleCount is the number of rules the Service owns in nat.
func (s *serviceRules) natRuleCount() int {
	n := len(s.natTop)
	for _, c := range s.natChains {
		n += len(c.rules)
	}
	return n
}

// line joins arguments with spaces.
type line []string

func (l *line) add(args ...string) *line { *l = append(*l, args...); return l }
func (l line) String() string            { return strings.Join(l, " ") }

// quoted returns s in double quotes, as upstream writes comments with spaces.
func quoted(s string) string { return `"` + s + `"` }

// probability returns upstream's 1/n with ten decimals.
func probability(n int) string { return fmt.Sprintf("%0.10f", 1.0/float64(n)) }

// renderService renders every port of one Service. ports must be the Service's ports in
// desired (in NodeState.PortsOf order).
func renderService(rc *renderConfig, name types.NamespacedName, ports []*model.ServicePort) *serviceRules {
	s := &serviceRules{name: name, ports: ports}
	for _, sp := range ports {
		renderPort(rc, sp, s)
	}
	if rc.faulty != nil && rc.faulty(name, ports) && len(s.natChains) > 0 {
		// A target the kernel refuses in a chain reachable from PREROUTING and OUTPUT.
		c := &s.natChains[len(s.natChains)-1]
		c.rules = append(c.rules, "-A "+c.name+" -m comment --comment \"sluice test: rejected by the kernel\" -j MASQUERADE")
	}
	return s
}

// rejectTarget is the target refusing traffic to a Service port without endpoints: a TCP
// reset for TCP, the default ICMP (ICMPv6) port unreachable otherwise. Upstream answers
// TCP with ICMP too, and Linux TCP takes an ICMP error that arrives while connect() holds
// the socket as a soft error (and ICMP errors are rate-limited per peer): such a client,
// IPv6 ones typically, waited for a SYN retransmit instead of being refused.
func rejectTarget(p model.Protocol) string {
	if p == model.TCP {
		return "REJECT --reject-with tcp-reset"
	}
	return "REJECT"
}

// renderPort appends one Service port's rules to s, following upstream's syncProxyRules
// case by case.
func renderPort(rc *renderConfig, sp *model.ServicePort, s *serviceRules) {
	portName := sp.Name.String()
	proto := sp.Name.Protocol.Lower()
	hash := portHash(portName, proto)
	clusterChain := prefixClusterPolicy + hash
	localChain := prefixLocalPolicy + hash
	externalChain := prefixExternal + hash
	firewallChain := prefixFirewall + hash
	port := strconv.Itoa(int(sp.Port))

	hasEndpoints := sp.HasAnyEndpoints
	usesClusterChain := len(sp.ClusterEndpoints) > 0 && sp.UsesClusterEndpoints()
	usesLocalChain := len(sp.LocalEndpoints) > 0 && sp.UsesLocalEndpoints()

	// Internal (ClusterIP) traffic goes to the Cluster or the Local policy chain.
	internalChain := clusterChain
	hasInternal := hasEndpoints
	if sp.InternalPolicyLocal {
		internalChain = localChain
		if len(sp.LocalEndpoints) == 0 {
			hasInternal = false
		}
	}
	// External traffic always enters KUBE-EXT, which then picks the policy chain.
	externalPolicyChain := clusterChain
	hasExternal := hasEndpoints
	if sp.ExternalPolicyLocal {
		externalPolicyChain = localChain
		if len(sp.LocalEndpoints) == 0 {
			hasExternal = false
		}
	}
	// KUBE-EXT exists whenever there are endpoints anywhere, even none usable for external
	// traffic: its short-circuit rules still serve pods and the node itself.
	usesExternalChain := hasEndpoints && sp.ExternallyAccessible()
	usesFirewallChain := hasEndpoints && len(sp.LoadBalancerVIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0
	lbChain := externalChain
	if usesFirewallChain {
		lbChain = firewallChain
	}

	var internalTarget, internalComment, externalTarget, externalComment string
	if !hasEndpoints {
		internalTarget, externalTarget = rejectTarget(sp.Name.Protocol), rejectTarget(sp.Name.Protocol)
		internalComment = quoted(portName + " has no endpoints")
		externalComment = internalComment
	} else {
		if !hasInternal {
			internalTarget = "DROP"
			internalComment = quoted(portName + " has no local endpoints")
			s.noLocalInternal++
		}
		if !hasExternal {
			externalTarget = "DROP"
			externalComment = quoted(portName + " has no local endpoints")
			s.noLocalExternal++
		}
	}

	nat := func(chain string, l *line) { s.natTop = append(s.natTop, topRule{chain, l.String()}) }
	filter := func(chain string, l *line) { s.filterTop = append(s.filterTop, topRule{chain, l.String()}) }
	dst := func(ip netip.Addr, comment string) *line {
		return (&line{}).add("-m", "comment", "--comment", comment, "-m", proto, "-p", proto, "-d", ip.String(), "--dport", port)
	}

	// ClusterIP.
	if hasInternal {
		nat(chainServices, dst(sp.ClusterIP, quoted(portName+" cluster IP")).add("-j", internalChain))
	} else {
		filter(chainServices, dst(sp.ClusterIP, internalComment).add("-j", internalTarget))
	}

	// externalIPs.
	for _, ip := range sp.ExternalIPs {
		if hasEndpoints {
			nat(chainServices, dst(ip, quoted(portName+" external IP")).add("-j", externalChain))
		}
		if !hasExternal {
			filter(chainExternalServices, dst(ip, externalComment).add("-j", externalTarget))
		}
	}

	// LoadBalancer IPs.
	for _, ip := range sp.LoadBalancerVIPs {
		if hasEndpoints {
			nat(chainServices, dst(ip, quoted(portName+" loadbalancer IP")).add("-j", lbChain))
		}
		if usesFirewallChain {
			filter(chainProxyFirewall, dst(ip, quoted(portName+" traffic not accepted by "+firewallChain)).add("-j", "DROP"))
		}
	}
	if !hasExternal {
		for _, ip := range sp.LoadBalancerVIPs {
			filter(chainExternalServices, dst(ip, externalComment).add("-j", externalTarget))
		}
	}

	// NodePort. NodePorts are not subject to loadBalancerSourceRanges (upstream: "for
	// better or for worse ... and we can't change that").
	if sp.NodePort != 0 {
		nodePort := strconv.Itoa(int(sp.NodePort))
		if hasEndpoints {
			if rc.localhostNodePorts && rc.nfacct {
				nat(chainNodePorts, (&line{}).add("-m", "comment", "--comment", portName, "-m", proto, "-p", proto,
					"-d", "127.0.0.0/8", "--dport", nodePort, "-m", "nfacct", "--nfacct-name", nfacctLocalhostAccept, "-j", externalChain))
			}
			nat(chainNodePorts, (&line{}).add("-m", "comment", "--comment", portName, "-m", proto, "-p", proto,
				"--dport", nodePort, "-j", externalChain))
		}
		if !hasExternal {
			filter(chainExternalServices, (&line{}).add("-m", "comment", "--comment", externalComment,
				"-m", "addrtype", "--dst-type", "LOCAL", "-m", proto, "-p", proto, "--dport", nodePort, "-j", externalTarget))
		}
	}

	// healthCheckNodePort: accepted whether or not there are local endpoints.
	if sp.HealthCheckNodePort != 0 {
		filter(chainNodePorts, (&line{}).add("-m", "comment", "--comment", quoted(portName+" health check node port"),
			"-m", "tcp", "-p", "tcp", "--dport", strconv.Itoa(int(sp.HealthCheckNodePort)), "-j", "ACCEPT"))
	}

	// Per-port chains, in upstream's order of creation, each with its rules.
	rules := map[string][]string{}
	var order []string
	add := func(name string, l *line) {
		if _, ok := rules[name]; !ok {
			order = append(order, name)
		}
		rules[name] = append(rules[name], "-A "+name+" "+l.String())
	}
	declare := func(name string) {
		if _, ok := rules[name]; !ok {
			order = append(order, name)
			rules[name] = nil
		}
	}

	// Masquerade off-node (or all, with masqueradeAll) traffic to the ClusterIP.
	if hasInternal {
		base := dst(sp.ClusterIP, quoted(portName+" cluster IP"))
		if rc.masqueradeAll {
			add(internalChain, base.add("-j", chainMarkMasq))
		} else if rc.ifNotLocal != nil {
			add(internalChain, base.add(rc.ifNotLocal...).add("-j", chainMarkMasq))
		}
	}

	if usesExternalChain {
		declare(externalChain)
		if !sp.ExternalPolicyLocal {
			add(externalChain, (&line{}).add("-m", "comment", "--comment", quoted("masquerade traffic for "+portName+" external destinations"),
				"-j", chainMarkMasq))
		} else {
			if rc.ifLocal != nil {
				// Pods reaching an external destination of the Service are treated like
				// going out to the load balancer and back: Cluster policy.
				add(externalChain, (&line{}).add("-m", "comment", "--comment", quoted("pod traffic for "+portName+" external destinations")).
					add(rc.ifLocal...).add("-j", clusterChain))
			}
			// The node itself: its source address is local, so masquerade, then Cluster.
			add(externalChain, (&line{}).add("-m", "comment", "--comment", quoted("masquerade LOCAL traffic for "+portName+" external destinations"),
				"-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq))
			add(externalChain, (&line{}).add("-m", "comment", "--comment", quoted("route LOCAL traffic for "+portName+" external destinations"),
				"-m", "addrtype", "--src-type", "LOCAL", "-j", clusterChain))
		}
		if hasExternal {
			add(externalChain, (&line{}).add("-j", externalPolicyChain))
		}
	}

	if usesFirewallChain {
		declare(firewallChain)
		comment := quoted(portName + " loadbalancer IP")
		allowFromNode := false
		for _, cidr := range sp.LoadBalancerSourceRanges {
			add(firewallChain, (&line{}).add("-m", "comment", "--comment", comment, "-s", cidr.String(), "-j", externalChain))
			if rc.nodeIP.IsValid() && cidr.Contains(rc.nodeIP) {
				allowFromNode = true
			}
		}
		if allowFromNode {
			// A VIP that is a local address loops back with the VIP as source.
			for _, ip := range sp.LoadBalancerVIPs {
				add(firewallChain, (&line{}).add("-m", "comment", "--comment", comment, "-s", ip.String(), "-j", externalChain))
			}
		}
		// A packet reaching the end was not DNATed: KUBE-PROXY-FIREWALL drops it.
		add(firewallChain, (&line{}).add("-m", "comment", "--comment", quoted("other traffic to "+portName+" will be dropped by KUBE-PROXY-FIREWALL")))
	}

	if usesClusterChain {
		declare(clusterChain)
		for _, l := range endpointJumps(rc, sp, portName, proto, sp.ClusterEndpoints) {
			add(clusterChain, l)
		}
	}
	if usesLocalChain {
		declare(localChain)
		for _, l := range endpointJumps(rc, sp, portName, proto, sp.LocalEndpoints) {
			add(localChain, l)
		}
	}

	for _, ep := range reachableEndpoints(sp, usesClusterChain, usesLocalChain) {
		epString := ep.String()
		sep := endpointChain(portName, proto, epString)
		declare(sep)
		base := func() *line {
			l := &line{}
			if !rc.largeCluster {
				l.add("-m", "comment", "--comment", portName)
			}
			return l
		}
		// Hairpin: an endpoint reaching itself through the Service must be masqueraded.
		add(sep, base().add("-s", ep.IP.String(), "-j", chainMarkMasq))
		l := base()
		if sp.AffinityTimeoutSeconds > 0 {
			l.add("-m", "recent", "--name", sep, "--set")
		}
		add(sep, l.add("-m", proto, "-p", proto, "-j", "DNAT", "--to-destination", epString))
	}

	for _, name := range order {
		s.natChains = append(s.natChains, chainRules{name: name, rules: rules[name]})
	}
}

// endpointJumps returns the rules of a KUBE-SVC or KUBE-SVL chain: affinity checks first,
// then one probabilistic jump per endpoint, the last one unconditional.
func endpointJumps(rc *renderConfig, sp *model.ServicePort, portName, proto string, eps []model.Endpoint) []*line {
	var out []*line
	comment := func(l *line, ep string) *line {
		if !rc.largeCluster {
			l.add("-m", "comment", "--comment", quoted(portName+" -> "+ep))
		}
		return l
	}
	if sp.AffinityTimeoutSeconds > 0 {
		for _, ep := range eps {
			epString := ep.String()
			sep := endpointChain(portName, proto, epString)
			out = append(out, comment(&line{}, epString).add("-m", "recent", "--name", sep,
				"--rcheck", "--seconds", strconv.Itoa(int(sp.AffinityTimeoutSeconds)), "--reap", "-j", sep))
		}
	}
	for i, ep := range eps {
		epString := ep.String()
		l := comment(&line{}, epString)
		if i < len(eps)-1 {
			l.add("-m", "statistic", "--mode", "random", "--probability", probability(len(eps)-i))
		}
		out = append(out, l.add("-j", endpointChain(portName, proto, epString)))
	}
	return out
}

// reachableEndpoints is the union of the endpoints the policy chains in use jump to, in
// ip:port order, without duplicates: each gets a KUBE-SEP chain.
func reachableEndpoints(sp *model.ServicePort, cluster, local bool) []model.Endpoint {
	var out []model.Endpoint
	if cluster {
		out = append(out, sp.ClusterEndpoints...)
	}
	if local {
		out = append(out, sp.LocalEndpoints...)
	}
	if cluster && local {
		slices.SortFunc(out, func(a, b model.Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
		out = slices.CompactFunc(out, func(a, b model.Endpoint) bool { return a.AddrPort() == b.AddrPort() })
	}
	return out
}

// staticRules are the rules that do not belong to any Service. They are written on full
// syncs only; when they would change (node addresses, sysctls), the next sync is full.
type staticRules struct {
	// natHead goes before the Services' rules, natTail after them (the KUBE-SERVICES jump to
	// KUBE-NODEPORTS must be the last rule of that chain).
	natHead, natTail []string
	filter           []string
	// kubeletFirewall is set when localhost NodePorts are on: KUBE-FIREWALL is then
	// declared (flushed) and refilled with kubelet's one rule.
	kubeletFirewall bool
}

func (s *staticRules) fingerprint() string {
	return strings.Join(s.natHead, "\n") + "\n--\n" + strings.Join(s.natTail, "\n") + "\n--\n" +
		strings.Join(s.filter, "\n") + "\n--\n" + strconv.FormatBool(s.kubeletFirewall)
}

func (s *staticRules) ruleCount(table string) int {
	if table == tableNAT {
		return len(s.natHead) + len(s.natTail)
	}
	return len(s.filter)
}

func renderStatic(rc *renderConfig) *staticRules {
	s := &staticRules{}
	s.natHead = append(s.natHead,
		"-A "+chainPostrouting+" -m mark ! --mark "+rc.mark+"/"+rc.mark+" -j RETURN",
		// Clear the mark so a packet that traverses the stack again is not masqueraded twice.
		"-A "+chainPostrouting+" -j MARK --xor-mark "+rc.mark,
		"-A "+chainPostrouting+" -m comment --comment "+quoted("kubernetes service traffic requiring SNAT")+" -j MASQUERADE --random-fully",
		"-A "+chainMarkMasq+" -j MARK --or-mark "+rc.mark,
	)
	const nodePortsComment = `"kubernetes service nodeports; NOTE: this must be the last rule in this chain"`
	if rc.nodePortMatchAll {
		l := (&line{}).add("-A", chainServices, "-m", "comment", "--comment", nodePortsComment, "-m", "addrtype", "--dst-type", "LOCAL")
		// Loopback NodePorts never work on IPv6, and on IPv4 only with route_localnet.
		if rc.family == model.IPv6 {
			l.add("!", "-d", "::1/128")
		} else if !rc.localhostNodePorts {
			l.add("!", "-d", "127.0.0.0/8")
		}
		s.natTail = append(s.natTail, l.add("-j", chainNodePorts).String())
	} else {
		for _, ip := range rc.nodePortIPs {
			if ip.IsLoopback() && (rc.family == model.IPv6 || !rc.localhostNodePorts) {
				continue
			}
			s.natTail = append(s.natTail, (&line{}).add("-A", chainServices, "-m", "comment", "--comment", nodePortsComment,
				"-d", ip.String(), "-j", chainNodePorts).String())
		}
	}

	if rc.localhostNodePorts {
		// route_localnet opens 127.0.0.0/8 to the network (https://issues.k8s.io/90259);
		// this is kubelet's own mitigation rule, which kubelet also writes.
		s.kubeletFirewall = true
		s.filter = append(s.filter, "-A "+chainKubeletFirewall+" -m comment --comment "+quoted("block incoming localnet connections")+
			" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP")
	}
	if !rc.tcpLiberal {
		// Out-of-window packets would otherwise reach a pod un-NATed and reset the
		// connection (https://issues.k8s.io/74839).
		l := (&line{}).add("-A", chainForward, "-m", "conntrack", "--ctstate", "INVALID")
		if rc.nfacct {
			l.add("-m", "nfacct", "--nfacct-name", nfacctInvalidDropped)
		}
		s.filter = append(s.filter, l.add("-j", "DROP").String())
	}
	s.filter = append(s.filter,
		"-A "+chainForward+" -m comment --comment "+quoted("kubernetes forwarding rules")+" -m mark --mark "+rc.mark+"/"+rc.mark+" -j ACCEPT",
		"-A "+chainForward+" -m comment --comment "+quoted("kubernetes forwarding conntrack rule")+" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
	)
	return s
}
