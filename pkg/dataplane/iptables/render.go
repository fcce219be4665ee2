package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
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
	rc.ifLocal, rc.ifNotLocal = xtables.LocalMatches(cfg.LocalDetector)
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
	// mangleTop are the packet counters' dispatch rules (in chainPackets) and
	// mangleChains their counter chains, of Counted ports only (packets.go).
	mangleTop    []topRule
	mangleChains []chainRules
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
// case by case: decide where each kind of traffic goes, write the top-level rules (in
// KUBE-SERVICES, KUBE-NODEPORTS and filter), then the port's own chains.
func renderPort(rc *renderConfig, sp *model.ServicePort, s *serviceRules) {
	pr := newPortRender(rc, sp, s)
	pr.clusterIPRules()
	pr.externalIPRules()
	pr.loadBalancerRules()
	pr.nodePortRules()
	pr.healthCheckRule()
	pr.clusterIPMasquerade()
	pr.externalChainRules()
	pr.firewallChainRules()
	pr.policyChains()
	pr.endpointChains()
	pr.counters()
	pr.packetCounters()
	for _, name := range pr.order {
		s.natChains = append(s.natChains, chainRules{name: name, rules: pr.rules[name]})
	}
}

// portRender holds one Service port's decisions while its rules are written.
type portRender struct {
	rc *renderConfig
	sp *model.ServicePort
	s  *serviceRules

	portName, proto, port                                  string
	clusterChain, localChain, externalChain, firewallChain string

	hasEndpoints, usesClusterChain, usesLocalChain bool
	// Internal (ClusterIP) traffic goes to internalChain when hasInternal.
	internalChain string
	hasInternal   bool
	// External traffic always enters KUBE-EXT, which then picks externalPolicyChain.
	externalPolicyChain string
	hasExternal         bool
	usesExternalChain   bool
	usesFirewallChain   bool
	// lbChain is where load-balancer IPs jump: KUBE-FW with source ranges, else KUBE-EXT.
	lbChain string
	// The targets and comments of traffic with nowhere to go (REJECT or DROP).
	internalTarget, internalComment, externalTarget, externalComment string

	// The port's chains, in upstream's order of creation, each with its rules.
	rules map[string][]string
	order []string
}

// newPortRender decides where each kind of traffic to the port goes.
func newPortRender(rc *renderConfig, sp *model.ServicePort, s *serviceRules) *portRender {
	portName := sp.Name.String()
	proto := sp.Name.Protocol.Lower()
	hash := portHash(portName, proto)
	pr := &portRender{
		rc: rc, sp: sp, s: s,
		portName:         portName,
		proto:            proto,
		port:             strconv.Itoa(int(sp.Port)),
		clusterChain:     prefixClusterPolicy + hash,
		localChain:       prefixLocalPolicy + hash,
		externalChain:    prefixExternal + hash,
		firewallChain:    prefixFirewall + hash,
		hasEndpoints:     sp.HasAnyEndpoints,
		usesClusterChain: len(sp.ClusterEndpoints) > 0 && sp.UsesClusterEndpoints(),
		usesLocalChain:   len(sp.LocalEndpoints) > 0 && sp.UsesLocalEndpoints(),
		rules:            map[string][]string{},
	}
	pr.internalChain, pr.hasInternal = pr.clusterChain, pr.hasEndpoints
	if sp.InternalPolicyLocal {
		pr.internalChain = pr.localChain
		if len(sp.LocalEndpoints) == 0 {
			pr.hasInternal = false
		}
	}
	pr.externalPolicyChain, pr.hasExternal = pr.clusterChain, pr.hasEndpoints
	if sp.ExternalPolicyLocal {
		pr.externalPolicyChain = pr.localChain
		if len(sp.LocalEndpoints) == 0 {
			pr.hasExternal = false
		}
	}
	// KUBE-EXT exists whenever there are endpoints anywhere, even none usable for external
	// traffic: its short-circuit rules still serve pods and the node itself.
	pr.usesExternalChain = pr.hasEndpoints && sp.ExternallyAccessible()
	pr.usesFirewallChain = pr.hasEndpoints && len(sp.LoadBalancerVIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0
	pr.lbChain = pr.externalChain
	if pr.usesFirewallChain {
		pr.lbChain = pr.firewallChain
	}
	pr.decideTargets()
	return pr
}

// decideTargets picks REJECT (no endpoints at all; a TCP reset for TCP, see rejectTarget)
// or DROP (no local endpoints for a Local policy) for traffic with nowhere to go.
func (pr *portRender) decideTargets() {
	if !pr.hasEndpoints {
		pr.internalTarget, pr.externalTarget = rejectTarget(pr.sp.Name.Protocol), rejectTarget(pr.sp.Name.Protocol)
		pr.internalComment = quoted(pr.portName + " has no endpoints")
		pr.externalComment = pr.internalComment
		return
	}
	if !pr.hasInternal {
		pr.internalTarget = "DROP"
		pr.internalComment = quoted(pr.portName + " has no local endpoints")
		pr.s.noLocalInternal++
	}
	if !pr.hasExternal {
		pr.externalTarget = "DROP"
		pr.externalComment = quoted(pr.portName + " has no local endpoints")
		pr.s.noLocalExternal++
	}
}

func (pr *portRender) nat(chain string, l *line) {
	pr.s.natTop = append(pr.s.natTop, topRule{chain, l.String()})
}

func (pr *portRender) filter(chain string, l *line) {
	pr.s.filterTop = append(pr.s.filterTop, topRule{chain, l.String()})
}

// dst starts a rule matching the port on destination ip.
func (pr *portRender) dst(ip netip.Addr, comment string) *line {
	return (&line{}).add("-m", "comment", "--comment", comment, "-m", pr.proto, "-p", pr.proto, "-d", ip.String(), "--dport", pr.port)
}

// add appends a rule to one of the port's chains, creating it on first use.
func (pr *portRender) add(name string, l *line) {
	if _, ok := pr.rules[name]; !ok {
		pr.order = append(pr.order, name)
	}
	pr.rules[name] = append(pr.rules[name], "-A "+name+" "+l.String())
}

// declare creates one of the port's chains, empty if nothing is added to it.
func (pr *portRender) declare(name string) {
	if _, ok := pr.rules[name]; !ok {
		pr.order = append(pr.order, name)
		pr.rules[name] = nil
	}
}

func (pr *portRender) clusterIPRules() {
	sp := pr.sp
	if pr.hasInternal {
		pr.nat(chainServices, pr.dst(sp.ClusterIP, quoted(pr.portName+" cluster IP")).add("-j", pr.internalChain))
	} else {
		pr.filter(chainServices, pr.dst(sp.ClusterIP, pr.internalComment).add("-j", pr.internalTarget))
	}
}

func (pr *portRender) externalIPRules() {
	for _, ip := range pr.sp.ExternalIPs {
		if pr.hasEndpoints {
			pr.nat(chainServices, pr.dst(ip, quoted(pr.portName+" external IP")).add("-j", pr.externalChain))
		}
		if !pr.hasExternal {
			pr.filter(chainExternalServices, pr.dst(ip, pr.externalComment).add("-j", pr.externalTarget))
		}
	}
}

func (pr *portRender) loadBalancerRules() {
	for _, ip := range pr.sp.LoadBalancerVIPs {
		if pr.hasEndpoints {
			pr.nat(chainServices, pr.dst(ip, quoted(pr.portName+" loadbalancer IP")).add("-j", pr.lbChain))
		}
		if pr.usesFirewallChain {
			pr.filter(chainProxyFirewall, pr.dst(ip, quoted(pr.portName+" traffic not accepted by "+pr.firewallChain)).add("-j", "DROP"))
		}
	}
	if !pr.hasExternal {
		for _, ip := range pr.sp.LoadBalancerVIPs {
			pr.filter(chainExternalServices, pr.dst(ip, pr.externalComment).add("-j", pr.externalTarget))
		}
	}
}

// nodePortRules: NodePorts are not subject to loadBalancerSourceRanges (upstream: "for
// better or for worse ... and we can't change that").
func (pr *portRender) nodePortRules() {
	if pr.sp.NodePort == 0 {
		return
	}
	portName, proto := pr.portName, pr.proto
	nodePort := strconv.Itoa(int(pr.sp.NodePort))
	if pr.hasEndpoints {
		if pr.rc.localhostNodePorts && pr.rc.nfacct {
			pr.nat(chainNodePorts, (&line{}).add("-m", "comment", "--comment", portName, "-m", proto, "-p", proto,
				"-d", "127.0.0.0/8", "--dport", nodePort, "-m", "nfacct", "--nfacct-name", nfacctLocalhostAccept, "-j", pr.externalChain))
		}
		pr.nat(chainNodePorts, (&line{}).add("-m", "comment", "--comment", portName, "-m", proto, "-p", proto,
			"--dport", nodePort, "-j", pr.externalChain))
	}
	if !pr.hasExternal {
		pr.filter(chainExternalServices, (&line{}).add("-m", "comment", "--comment", pr.externalComment,
			"-m", "addrtype", "--dst-type", "LOCAL", "-m", proto, "-p", proto, "--dport", nodePort, "-j", pr.externalTarget))
	}
}

// healthCheckRule: the healthCheckNodePort is accepted whether or not there are local
// endpoints.
func (pr *portRender) healthCheckRule() {
	if pr.sp.HealthCheckNodePort == 0 {
		return
	}
	pr.filter(chainNodePorts, (&line{}).add("-m", "comment", "--comment", quoted(pr.portName+" health check node port"),
		"-m", "tcp", "-p", "tcp", "--dport", strconv.Itoa(int(pr.sp.HealthCheckNodePort)), "-j", "ACCEPT"))
}

// clusterIPMasquerade masquerades off-node (or all, with masqueradeAll) traffic to the
// ClusterIP.
func (pr *portRender) clusterIPMasquerade() {
	if !pr.hasInternal {
		return
	}
	base := pr.dst(pr.sp.ClusterIP, quoted(pr.portName+" cluster IP"))
	if pr.rc.masqueradeAll {
		pr.add(pr.internalChain, base.add("-j", chainMarkMasq))
	} else if pr.rc.ifNotLocal != nil {
		pr.add(pr.internalChain, base.add(pr.rc.ifNotLocal...).add("-j", chainMarkMasq))
	}
}

// externalChainRules writes KUBE-EXT: masquerade, short-circuits for pods and the node under
// a Local policy, then the policy chain.
func (pr *portRender) externalChainRules() {
	if !pr.usesExternalChain {
		return
	}
	ext, portName := pr.externalChain, pr.portName
	pr.declare(ext)
	if !pr.sp.ExternalPolicyLocal {
		pr.add(ext, (&line{}).add("-m", "comment", "--comment", quoted("masquerade traffic for "+portName+" external destinations"),
			"-j", chainMarkMasq))
	} else {
		if pr.rc.ifLocal != nil {
			// Pods reaching an external destination of the Service are treated like
			// going out to the load balancer and back: Cluster policy.
			pr.add(ext, (&line{}).add("-m", "comment", "--comment", quoted("pod traffic for "+portName+" external destinations")).
				add(pr.rc.ifLocal...).add("-j", pr.clusterChain))
		}
		// The node itself: its source address is local, so masquerade, then Cluster.
		pr.add(ext, (&line{}).add("-m", "comment", "--comment", quoted("masquerade LOCAL traffic for "+portName+" external destinations"),
			"-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq))
		pr.add(ext, (&line{}).add("-m", "comment", "--comment", quoted("route LOCAL traffic for "+portName+" external destinations"),
			"-m", "addrtype", "--src-type", "LOCAL", "-j", pr.clusterChain))
	}
	if pr.hasExternal {
		pr.add(ext, (&line{}).add("-j", pr.externalPolicyChain))
	}
}

// firewallChainRules writes KUBE-FW: the allowed source ranges jump to KUBE-EXT.
func (pr *portRender) firewallChainRules() {
	if !pr.usesFirewallChain {
		return
	}
	fw, sp := pr.firewallChain, pr.sp
	pr.declare(fw)
	comment := quoted(pr.portName + " loadbalancer IP")
	allowFromNode := false
	for _, cidr := range sp.LoadBalancerSourceRanges {
		pr.add(fw, (&line{}).add("-m", "comment", "--comment", comment, "-s", cidr.String(), "-j", pr.externalChain))
		if pr.rc.nodeIP.IsValid() && cidr.Contains(pr.rc.nodeIP) {
			allowFromNode = true
		}
	}
	if allowFromNode {
		// A VIP that is a local address loops back with the VIP as source.
		for _, ip := range sp.LoadBalancerVIPs {
			pr.add(fw, (&line{}).add("-m", "comment", "--comment", comment, "-s", ip.String(), "-j", pr.externalChain))
		}
	}
	// A packet reaching the end was not DNATed: KUBE-PROXY-FIREWALL drops it.
	pr.add(fw, (&line{}).add("-m", "comment", "--comment", quoted("other traffic to "+pr.portName+" will be dropped by KUBE-PROXY-FIREWALL")))
}

// counterComment ends the comment of a traffic counter rule.
const counterComment = " traffic counter"

// counters counts the new connections of each path chain (KUBE-SVC, KUBE-SVL, KUBE-EXT)
// of a Counted port: the path chain's first rule jumps to the port's counter chain for
// the path (SLUICE-NEW{C,L,E}-h), whose one rule, without a target, counts and returns.
// The chains are nat chains, which netfilter runs for the first packet of a connection
// only: the counter rule's packets are the path's new connections (README, "Traffic
// counters"). The counter chain's rule depends on the port's name only, so rewriting the
// path chain (an endpoint change) leaves it, and its counts, alone.
func (pr *portRender) counters() {
	if !pr.sp.Counted {
		return
	}
	comment := quoted(pr.portName + counterComment)
	for _, nc := range newConnCounters(pr.sp) {
		rules, ok := pr.rules[nc.pathChain]
		if !ok {
			continue
		}
		jump := "-A " + nc.pathChain + " -m comment --comment " + comment + " -j " + nc.Chain
		pr.rules[nc.pathChain] = append([]string{jump}, rules...)
		pr.add(nc.Chain, (&line{}).add("-m", "comment", "--comment", comment))
	}
}

// newConnCounter is a path chain of a Counted port and its new-connection counter chain.
type newConnCounter struct {
	pathChain string
	// ChainPath is the counter chain and its path.
	dataplane.ChainPath
}

// newConnCounters returns the path chains of a Counted port that exist (KUBE-SVC and
// KUBE-SVL only with endpoints for them, KUBE-EXT with endpoints anywhere), with their
// counter chains and paths.
func newConnCounters(sp *model.ServicePort) []newConnCounter {
	hash := portHash(sp.Name.String(), sp.Name.Protocol.Lower())
	var out []newConnCounter
	if len(sp.ClusterEndpoints) > 0 && sp.UsesClusterEndpoints() {
		out = append(out, newConnCounter{prefixClusterPolicy + hash, dataplane.ChainPath{Chain: prefixNewConnCluster + hash, Path: dataplane.PathCluster}})
	}
	if len(sp.LocalEndpoints) > 0 && sp.UsesLocalEndpoints() {
		out = append(out, newConnCounter{prefixLocalPolicy + hash, dataplane.ChainPath{Chain: prefixNewConnLocal + hash, Path: dataplane.PathLocal}})
	}
	if sp.HasAnyEndpoints && sp.ExternallyAccessible() {
		out = append(out, newConnCounter{prefixExternal + hash, dataplane.ChainPath{Chain: prefixNewConnExternal + hash, Path: dataplane.PathExternal}})
	}
	return out
}

// countedChains returns the new-connection counter chains of a Counted port and their
// paths.
func countedChains(sp *model.ServicePort) []dataplane.ChainPath {
	var out []dataplane.ChainPath
	for _, nc := range newConnCounters(sp) {
		out = append(out, nc.ChainPath)
	}
	return out
}

// policyChains writes KUBE-SVC and KUBE-SVL: the jumps to the endpoints.
func (pr *portRender) policyChains() {
	sp := pr.sp
	if pr.usesClusterChain {
		pr.declare(pr.clusterChain)
		for _, l := range endpointJumps(pr.rc, sp, pr.portName, pr.proto, sp.ClusterEndpoints) {
			pr.add(pr.clusterChain, l)
		}
	}
	if pr.usesLocalChain {
		pr.declare(pr.localChain)
		for _, l := range endpointJumps(pr.rc, sp, pr.portName, pr.proto, sp.LocalEndpoints) {
			pr.add(pr.localChain, l)
		}
	}
}

// endpointChains writes one KUBE-SEP chain per reachable endpoint: hairpin masquerade,
// then DNAT.
func (pr *portRender) endpointChains() {
	sp, proto := pr.sp, pr.proto
	for _, ep := range reachableEndpoints(sp, pr.usesClusterChain, pr.usesLocalChain) {
		epString := ep.String()
		sep := endpointChain(pr.portName, proto, epString)
		pr.declare(sep)
		base := func() *line {
			l := &line{}
			if !pr.rc.largeCluster {
				l.add("-m", "comment", "--comment", pr.portName)
			}
			return l
		}
		// Hairpin: an endpoint reaching itself through the Service must be masqueraded.
		pr.add(sep, base().add("-s", ep.IP.String(), "-j", chainMarkMasq))
		l := base()
		if sp.AffinityTimeoutSeconds > 0 {
			l.add("-m", "recent", "--name", sep, "--set")
		}
		pr.add(sep, l.add("-m", proto, "-p", proto, "-j", "DNAT", "--to-destination", epString))
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
