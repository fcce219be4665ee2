package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Config is what decides a packet's fate on this node besides the desired state: the
// mode and the resolved settings every backend shares (see config.Effective.DataplaneConfig).
type Config struct {
	// Mode is the backend: iptables, nftables or ipvs. The three differ in a few corners
	// (see README.md); "" reads as iptables.
	Mode dataplane.Mode
	// MasqueradeAll masquerades all traffic to ClusterIPs.
	MasqueradeAll bool
	// LocalhostNodePorts is true when NodePorts answer on 127.0.0.1 (iptables mode, IPv4,
	// iptables.localhostNodePorts).
	LocalhostNodePorts bool
	// NodePortAddresses says which local addresses NodePorts answer on.
	NodePortAddresses dataplane.NodePortAddresses
	// LocalDetector recognises traffic from pods.
	LocalDetector dataplane.LocalDetector
	// LocalAddresses are addresses of this node besides the node IPs the state knows (a pod
	// bridge's address, a second interface): a packet from one comes from the node itself,
	// and with a match-all nodePortAddresses NodePorts answer on them.
	LocalAddresses []netip.Addr
}

// SourceKind classifies where a packet comes from, which decides the traffic policy of
// external destinations and masquerading.
type SourceKind string

const (
	// SourcePod is traffic the local-traffic detector recognises as coming from a pod.
	SourcePod SourceKind = "pod"
	// SourceNode is traffic the node itself sends (its source is a local address).
	SourceNode SourceKind = "node"
	// SourceExternal is everything else: other nodes' host traffic, clients outside the
	// cluster, and pods the detector does not recognise.
	SourceExternal SourceKind = "external"
)

// Packet is the first packet of a connection, as it arrives at (or leaves from) this node.
type Packet struct {
	Source      netip.Addr
	Destination netip.AddrPort
	Protocol    model.Protocol
	// SourceKind overrides the classification of Source ("" decides from the address); use
	// it with an interface-based detector (BridgeInterface, InterfaceNamePrefix), which an
	// address cannot tell.
	SourceKind SourceKind
}

// Via names the kind of Service address a packet matched.
type Via string

const (
	ViaClusterIP      Via = "ClusterIP"
	ViaExternalIP     Via = "ExternalIP"
	ViaLoadBalancerIP Via = "LoadBalancerIP"
	ViaNodePort       Via = "NodePort"
)

// External reports whether traffic through this kind of address is under
// externalTrafficPolicy (everything but the ClusterIP).
func (v Via) External() bool { return v != ViaClusterIP }

// Action is what happens to the packet.
type Action string

const (
	// ActionDNAT: the packet is sent to one of the candidate endpoints.
	ActionDNAT Action = "dnat"
	// ActionReject: the client gets a refusal (TCP RST / ICMP port unreachable).
	ActionReject Action = "reject"
	// ActionDrop: the packet is silently dropped; the client times out.
	ActionDrop Action = "drop"
	// ActionNone: no Service matches; sluice leaves the packet alone.
	ActionNone Action = "none"
)

// Cause says why the verdict is what it is.
type Cause string

const (
	CauseEndpoints          Cause = "Endpoints"
	CauseNoEndpoints        Cause = "NoEndpoints"
	CauseNoLocalEndpoints   Cause = "NoLocalEndpoints"
	CauseSourceRange        Cause = "SourceRange"
	CauseNoService          Cause = "NoServiceMatches"
	CauseUndefinedPort      Cause = "UndefinedClusterIPPort"
	CauseUnallocatedAddress Cause = "UnallocatedServiceAddress"
)

// Verdict is the packet's fate.
type Verdict struct {
	Action Action `json:"action"`
	Cause  Cause  `json:"cause"`
	// Summary is the verdict in one line, e.g. "DNAT to one of 3 endpoints".
	Summary string `json:"summary"`
}

// SourceView is how the packet's source was classified, and why.
type SourceView struct {
	Kind   SourceKind `json:"kind"`
	Reason string     `json:"reason"`
}

// Match is the Service port a packet's destination matched.
type Match struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	PortName  string `json:"portName"`
	Protocol  string `json:"protocol"`
	Type      string `json:"type"`
	Via       Via    `json:"via"`
	// Reason says how the destination matched, e.g. "NodePort 30080 on node IP 172.18.0.2".
	Reason string `json:"reason"`
}

// String returns "ns/name:port/PROTO" ("ns/name/PROTO" for an unnamed port).
func (m *Match) String() string {
	s := m.Namespace + "/" + m.Name
	if m.PortName != "" {
		s += ":" + m.PortName
	}
	return s + "/" + m.Protocol
}

// PolicyDecision is the traffic policy that applies to this packet.
type PolicyDecision struct {
	// Field is "internalTrafficPolicy" or "externalTrafficPolicy".
	Field string `json:"field"`
	// Configured is the Service's value of Field.
	Configured string `json:"configured"`
	// Applied is the endpoint list the packet goes to.
	Applied Policy `json:"applied"`
	Reason  string `json:"reason"`
}

// SourceRangeCheck is the loadBalancerSourceRanges decision (LoadBalancer IPs only).
type SourceRangeCheck struct {
	Ranges  []string `json:"ranges"`
	Allowed bool     `json:"allowed"`
	Reason  string   `json:"reason"`
}

// Masquerade says whether the endpoint sees the client's address or the node's.
type Masquerade struct {
	Masquerade bool   `json:"masquerade"`
	Reason     string `json:"reason"`
}

// Explanation is the answer for one packet.
type Explanation struct {
	Node        string `json:"node"`
	Family      string `json:"family"`
	Mode        string `json:"mode"`
	Source      string `json:"source"`
	Destination string `json:"destination"`
	Protocol    string `json:"protocol"`

	SourceClass SourceView `json:"sourceClass"`
	// Match is nil when no Service port matches.
	Match *Match `json:"match"`
	// OtherMatches are further Service ports claiming the same destination (a conflict in
	// the API objects; the kernel uses the first).
	OtherMatches []Match           `json:"otherMatches,omitempty"`
	Policy       *PolicyDecision   `json:"policy,omitempty"`
	SourceRange  *SourceRangeCheck `json:"sourceRange,omitempty"`
	// AffinityTimeoutSeconds is set for ClientIP session affinity.
	AffinityTimeoutSeconds int32 `json:"affinityTimeoutSeconds,omitempty"`
	// Selection is the endpoint list the policy chose, with a decision for every endpoint
	// of the port.
	Selection *Selection `json:"selection,omitempty"`
	// Candidates are the endpoints the packet may be sent to ("ip:port").
	Candidates []string    `json:"candidates"`
	Masquerade *Masquerade `json:"masquerade,omitempty"`
	Verdict    Verdict     `json:"verdict"`
	Notes      []string    `json:"notes,omitempty"`
}

// Explain says what this node does with pkt, given the desired state of its family.
func Explain(state *model.StateView, cfg Config, pkt Packet) Explanation {
	e := Explanation{
		Node:        state.Node.Name,
		Family:      state.Family,
		Mode:        string(modeOf(cfg)),
		Source:      pkt.Source.String(),
		Destination: pkt.Destination.String(),
		Protocol:    string(pkt.Protocol),
		Candidates:  []string{},
	}
	n := newNodeFacts(state, cfg)
	e.SourceClass = n.classify(pkt)

	matches := findMatches(state, n, cfg, pkt, &e.Notes)
	if len(matches) == 0 {
		e.Verdict = noMatchVerdict(state, cfg, pkt, &e.Notes)
		return e
	}
	m := matches[0]
	e.Match = &m.match
	for _, o := range matches[1:] {
		e.OtherMatches = append(e.OtherMatches, o.match)
	}
	if len(e.OtherMatches) > 0 {
		e.Notes = append(e.Notes, "more than one Service port claims this destination: the API objects conflict, and which one the kernel uses is not defined")
	}
	sp := m.port
	e.AffinityTimeoutSeconds = sp.AffinityTimeoutSeconds

	// loadBalancerSourceRanges filter LoadBalancer IPs only, never NodePorts or externalIPs.
	if m.match.Via == ViaLoadBalancerIP && len(sp.LoadBalancerSourceRanges) > 0 {
		e.SourceRange = n.checkSourceRange(sp, pkt.Source)
		// iptables mode filters sources only for Services with endpoints (its firewall
		// chain is not written otherwise, and the no-endpoints REJECT wins); nftables and
		// ipvs check the source before anything else.
		if !e.SourceRange.Allowed && (modeOf(cfg) != dataplane.ModeIPTables || sp.HasAnyEndpoints) {
			e.Verdict = Verdict{Action: ActionDrop, Cause: CauseSourceRange,
				Summary: "drop: the source is not in the Service's loadBalancerSourceRanges"}
			return e
		}
	}

	r := route(state, sp, cfg, m.match.Via, e.SourceClass.Kind)
	e.Policy, e.Selection, e.Candidates, e.Verdict = r.Policy, r.Selection, r.Candidates, r.Verdict
	e.Notes = append(e.Notes, r.Notes...)
	if e.Verdict.Action == ActionDNAT {
		e.Masquerade = decideMasquerade(sp, m.match.Via, e.SourceClass, pkt.Source, e.Candidates, cfg)
		if sp.AffinityTimeoutSeconds > 0 {
			e.Notes = append(e.Notes, fmt.Sprintf("sessionAffinity ClientIP: the first connection from %s picks an endpoint at random; its later connections go to the same one while they come less than %ds apart", pkt.Source, sp.AffinityTimeoutSeconds))
		}
	}
	return e
}

// routeResult is where traffic of one kind to one Service port goes.
type routeResult struct {
	Policy     *PolicyDecision
	Selection  *Selection
	Candidates []string
	Verdict    Verdict
	Notes      []string
}

// route decides the policy, the endpoint list and the verdict for traffic through via
// from a source of kind (source ranges already passed).
func route(state *model.StateView, sp *model.ServicePortView, cfg Config, via Via, kind SourceKind) routeResult {
	r := routeResult{Policy: decidePolicy(sp, via, kind, cfg), Candidates: []string{}}
	sel := Select(sp, state.Node, r.Policy.Applied)
	r.Selection = &sel
	for _, c := range sel.Candidates() {
		r.Candidates = append(r.Candidates, addrPort(&c))
	}
	switch {
	case !sp.HasAnyEndpoints:
		r.Verdict = Verdict{Action: ActionReject, Cause: CauseNoEndpoints,
			Summary: "reject: the Service has no usable endpoint anywhere (none ready, none serving while terminating)"}
		if modeOf(cfg) == dataplane.ModeIPVS {
			r.Notes = append(r.Notes, "ipvs mode: the virtual server has no real server, and IPVS answers ICMP port unreachable")
		}
	case len(r.Candidates) == 0 && modeOf(cfg) == dataplane.ModeIPVS && !via.External():
		r.Verdict = Verdict{Action: ActionReject, Cause: CauseNoLocalEndpoints,
			Summary: "reject: internalTrafficPolicy Local and no usable endpoint on this node (ipvs: a virtual server without real servers answers port unreachable)"}
	case len(r.Candidates) == 0:
		r.Verdict = Verdict{Action: ActionDrop, Cause: CauseNoLocalEndpoints,
			Summary: fmt.Sprintf("drop: %s Local and no usable endpoint on this node (endpoints exist elsewhere)", r.Policy.Field)}
	default:
		r.Verdict = Verdict{Action: ActionDNAT, Cause: CauseEndpoints, Summary: dnatSummary(len(r.Candidates))}
	}
	return r
}

func dnatSummary(n int) string {
	if n == 1 {
		return "DNAT to the only candidate endpoint"
	}
	return fmt.Sprintf("DNAT to one of %d endpoints, chosen at random", n)
}

func modeOf(cfg Config) dataplane.Mode {
	if cfg.Mode == "" {
		return dataplane.ModeIPTables
	}
	return cfg.Mode
}

// nodeFacts is what the state and config say about this node's addresses.
type nodeFacts struct {
	cfg Config
	// nodeIPs are the node's IPs of the state's family, primary first.
	nodeIPs []netip.Addr
	// local are every address known to be this node's.
	local    []netip.Addr
	podCIDRs []netip.Prefix
	family   model.IPFamily
}

func newNodeFacts(state *model.StateView, cfg Config) *nodeFacts {
	n := &nodeFacts{cfg: cfg, family: model.IPv4}
	if state.Family == model.IPv6.String() {
		n.family = model.IPv6
	}
	for _, s := range state.Node.IPs {
		if a, err := netip.ParseAddr(s); err == nil && model.FamilyOf(a) == n.family {
			n.nodeIPs = append(n.nodeIPs, a.Unmap())
		}
	}
	n.local = append(n.local, n.nodeIPs...)
	for _, a := range cfg.LocalAddresses {
		if model.FamilyOf(a) == n.family && !slices.Contains(n.local, a.Unmap()) {
			n.local = append(n.local, a.Unmap())
		}
	}
	for _, s := range state.Node.PodCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil && model.FamilyOf(p.Addr()) == n.family {
			n.podCIDRs = append(n.podCIDRs, p)
		}
	}
	return n
}

func (n *nodeFacts) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(n.local, a.Unmap())
}

// classify decides the source kind as the rules do: the local-traffic detector first (the
// short-circuit rule for pods comes before the one for the node), then local addresses.
func (n *nodeFacts) classify(pkt Packet) SourceView {
	if pkt.SourceKind != "" {
		return SourceView{Kind: pkt.SourceKind, Reason: "given on the command line"}
	}
	src := pkt.Source.Unmap()
	d := n.cfg.LocalDetector
	switch d.Mode {
	case dataplane.DetectLocalClusterCIDR, dataplane.DetectLocalNodeCIDR:
		for _, c := range d.CIDRs {
			if c.Contains(src) {
				what := "the cluster CIDR"
				if d.Mode == dataplane.DetectLocalNodeCIDR {
					what = "this node's pod CIDR"
				}
				return SourceView{Kind: SourcePod, Reason: fmt.Sprintf("in %s %s (detectLocalMode %s)", what, c, d.Mode)}
			}
		}
	case dataplane.DetectLocalBridgeInterface, dataplane.DetectLocalInterfaceNamePrefix:
		for _, c := range n.podCIDRs {
			if c.Contains(src) && d.Interface != "" {
				return SourceView{Kind: SourcePod, Reason: fmt.Sprintf("assumed from this node's pod CIDR %s: detectLocalMode %s recognises pods by interface (%s), which an address cannot show; pass --source-kind to override", c, d.Mode, d.Interface)}
			}
		}
	}
	if n.isLocal(src) {
		return SourceView{Kind: SourceNode, Reason: "an address of this node: traffic the node itself sends"}
	}
	reason := "neither a pod (by the local-traffic detector) nor an address of this node"
	if d.IsNoOp() {
		reason = "no local-traffic detector is configured (e.g. no clusterCIDR), so no traffic is recognised as coming from a pod"
	}
	return SourceView{Kind: SourceExternal, Reason: reason}
}

// checkSourceRange decides loadBalancerSourceRanges: the source must be in a range; when
// the node's primary IP is in one, the LoadBalancer IPs themselves are allowed too (a VIP
// that is a local address loops back with itself as source).
func (n *nodeFacts) checkSourceRange(sp *model.ServicePortView, src netip.Addr) *SourceRangeCheck {
	c := &SourceRangeCheck{Ranges: slices.Clone(sp.LoadBalancerSourceRanges)}
	nodeAllowed := false
	for _, r := range sp.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			continue
		}
		if p.Contains(src.Unmap()) {
			c.Allowed, c.Reason = true, fmt.Sprintf("source %s is in %s", src, r)
			return c
		}
		if len(n.nodeIPs) > 0 && p.Contains(n.nodeIPs[0]) {
			nodeAllowed = true
		}
	}
	if nodeAllowed && slices.Contains(sp.LoadBalancerVIPs, src.Unmap().String()) {
		c.Allowed, c.Reason = true, "the node's IP is in a range, and the source is one of the Service's LoadBalancer IPs (traffic from the node to a local VIP)"
		return c
	}
	c.Reason = fmt.Sprintf("source %s is in none of %s", src, strings.Join(sp.LoadBalancerSourceRanges, ", "))
	return c
}

type portMatch struct {
	port  *model.ServicePortView
	match Match
}

// findMatches returns the Service ports that claim the destination, in the order the
// kernel looks: Service IPs (ClusterIP, externalIPs, LoadBalancer IPs), then NodePorts.
func findMatches(state *model.StateView, n *nodeFacts, cfg Config, pkt Packet, notes *[]string) []portMatch {
	dst := pkt.Destination.Addr().Unmap()
	dstStr := dst.String()
	port := int32(pkt.Destination.Port())
	var vips, nodePorts []portMatch
	nodePortNoted := false
	for i := range state.Services {
		sp := &state.Services[i]
		if sp.Protocol != string(pkt.Protocol) {
			continue
		}
		m := Match{Namespace: sp.Namespace, Name: sp.Name, PortName: sp.PortName, Protocol: sp.Protocol, Type: sp.Type}
		switch {
		case sp.Port == port && sp.ClusterIP == dstStr:
			m.Via, m.Reason = ViaClusterIP, fmt.Sprintf("ClusterIP %s port %d", dstStr, port)
			vips = append(vips, portMatch{sp, m})
		case sp.Port == port && slices.Contains(sp.ExternalIPs, dstStr):
			m.Via, m.Reason = ViaExternalIP, fmt.Sprintf("externalIP %s port %d", dstStr, port)
			vips = append(vips, portMatch{sp, m})
		case sp.Port == port && slices.Contains(sp.LoadBalancerVIPs, dstStr):
			m.Via, m.Reason = ViaLoadBalancerIP, fmt.Sprintf("LoadBalancer IP %s port %d", dstStr, port)
			vips = append(vips, portMatch{sp, m})
		case sp.NodePort != 0 && sp.NodePort == port:
			ok, why := n.nodePortAnswersOn(dst, pkt, cfg)
			if ok {
				m.Via, m.Reason = ViaNodePort, fmt.Sprintf("NodePort %d on %s", port, why)
				nodePorts = append(nodePorts, portMatch{sp, m})
			} else if !nodePortNoted {
				nodePortNoted = true
				*notes = append(*notes, fmt.Sprintf("%d is the NodePort of %s, but not on %s: %s", port, sp.String(), dstStr, why))
			}
		}
	}
	return append(vips, nodePorts...)
}

// nodePortAnswersOn says whether NodePorts answer on dst, and why (or why not).
func (n *nodeFacts) nodePortAnswersOn(dst netip.Addr, pkt Packet, cfg Config) (bool, string) {
	mode := modeOf(cfg)
	npa := cfg.NodePortAddresses
	if dst.IsLoopback() {
		switch {
		case mode != dataplane.ModeIPTables || n.family != model.IPv4:
			return false, fmt.Sprintf("NodePorts never answer on loopback addresses in %s mode for %s", mode, n.family)
		case !cfg.LocalhostNodePorts:
			return false, "iptables.localhostNodePorts is off"
		case !npa.ContainsLoopback():
			return false, "nodePortAddresses does not include 127.0.0.0/8"
		}
		return true, "loopback address " + dst.String() + " (iptables localhostNodePorts; from the node itself only)"
	}
	if mode == dataplane.ModeIPVS && dst.IsLinkLocalUnicast() {
		return false, "ipvs mode never puts NodePorts on link-local addresses"
	}
	local := slices.Contains(n.local, dst)
	if npa.MatchAll {
		if local {
			return true, "local address " + dst.String() + " (nodePortAddresses: every local address)"
		}
		return false, "not a known address of this node (its node IPs: " + addrList(n.nodeIPs) + "; pass --local-address to add others)"
	}
	for _, c := range npa.CIDRs {
		if c.Contains(dst) {
			if local {
				return true, fmt.Sprintf("local address %s (in nodePortAddresses %s)", dst, c)
			}
			return false, fmt.Sprintf("in nodePortAddresses %s but not a known address of this node (pass --local-address if it is one)", c)
		}
	}
	cidrs := make([]string, 0, len(npa.CIDRs))
	for _, c := range npa.CIDRs {
		cidrs = append(cidrs, c.String())
	}
	return false, "nodePortAddresses (" + strings.Join(cidrs, ", ") + ") does not include it"
}

// noMatchVerdict: sluice leaves the packet alone, except that nftables mode rejects
// undefined ports of ClusterIPs and drops traffic to unallocated Service addresses.
func noMatchVerdict(state *model.StateView, cfg Config, pkt Packet, notes *[]string) Verdict {
	dst := pkt.Destination.Addr().Unmap()
	dstStr := dst.String()
	var ports []string
	for i := range state.Services {
		sp := &state.Services[i]
		if sp.ClusterIP == dstStr || slices.Contains(sp.ExternalIPs, dstStr) || slices.Contains(sp.LoadBalancerVIPs, dstStr) {
			ports = append(ports, fmt.Sprintf("%s %d/%s", sp.String(), sp.Port, sp.Protocol))
		}
	}
	if len(ports) > 0 {
		*notes = append(*notes, fmt.Sprintf("%s belongs to %s; none is %d/%s", dstStr, strings.Join(ports, ", "), pkt.Destination.Port(), pkt.Protocol))
	}
	if modeOf(cfg) == dataplane.ModeNFTables {
		for i := range state.Services {
			if state.Services[i].ClusterIP == dstStr {
				return Verdict{Action: ActionReject, Cause: CauseUndefinedPort,
					Summary: "reject: the destination is a ClusterIP, but no Service port is defined for this port and protocol (nftables rejects those)"}
			}
		}
		for _, s := range state.ServiceCIDRs {
			if p, err := netip.ParsePrefix(s); err == nil && p.Contains(dst) {
				return Verdict{Action: ActionDrop, Cause: CauseUnallocatedAddress,
					Summary: fmt.Sprintf("drop: %s is in the Service range %s but is no Service's ClusterIP (nftables drops those)", dstStr, s)}
			}
		}
	}
	return Verdict{Action: ActionNone, Cause: CauseNoService,
		Summary: "no Service port matches: sluice does not touch this packet, which is routed as usual"}
}

// decidePolicy picks the endpoint list for a packet through via from a source of kind.
func decidePolicy(sp *model.ServicePortView, via Via, kind SourceKind, cfg Config) *PolicyDecision {
	if !via.External() {
		d := &PolicyDecision{Field: "internalTrafficPolicy", Configured: sp.InternalTrafficPolicy, Applied: PolicyCluster,
			Reason: "traffic to the ClusterIP: endpoints on every node"}
		if sp.InternalTrafficPolicy == "Local" {
			d.Applied, d.Reason = PolicyLocal, "traffic to the ClusterIP: only this node's endpoints"
		}
		return d
	}
	d := &PolicyDecision{Field: "externalTrafficPolicy", Configured: sp.ExternalTrafficPolicy, Applied: PolicyCluster,
		Reason: "endpoints on every node; the source is masqueraded"}
	if sp.ExternalTrafficPolicy != "Local" {
		return d
	}
	if modeOf(cfg) == dataplane.ModeIPVS {
		// ipvs: the virtual server's real servers are the local endpoints when there are
		// any, for every source; otherwise the cluster's, and a firewall rule drops
		// whatever does not come from a pod or the node.
		if len(sp.LocalEndpoints) > 0 {
			d.Applied, d.Reason = PolicyLocal, "ipvs sends every source to this node's endpoints when it has some"
			return d
		}
		if kind == SourcePod || kind == SourceNode {
			d.Reason = "no endpoint on this node: ipvs sends pods and the node to the cluster's endpoints (and drops other sources)"
			return d
		}
		d.Applied, d.Reason = PolicyLocal, "an external source: only this node's endpoints; the client's address is kept"
		return d
	}
	switch kind {
	case SourcePod:
		d.Reason = "but the source is a pod: pod traffic to an external address of the Service is short-circuited to the Cluster endpoints, as if it had gone out to the load balancer and back"
	case SourceNode:
		d.Reason = "but the source is this node: short-circuited to the Cluster endpoints (and masqueraded)"
	default:
		d.Applied, d.Reason = PolicyLocal, "an external source: only this node's endpoints; the client's address is kept"
	}
	return d
}

// decideMasquerade says whether the endpoint will see the node's address instead of the
// client's.
func decideMasquerade(sp *model.ServicePortView, via Via, src SourceView, source netip.Addr, candidates []string, cfg Config) *Masquerade {
	hairpin := false
	for _, c := range candidates {
		if ap, err := netip.ParseAddrPort(c); err == nil && ap.Addr() == source.Unmap() {
			hairpin = true
		}
	}
	var m *Masquerade
	switch {
	case !via.External() && cfg.MasqueradeAll:
		m = &Masquerade{true, "masqueradeAll is set"}
	case !via.External() && cfg.LocalDetector.IsNoOp():
		m = &Masquerade{false, "no local-traffic detector: ClusterIP traffic is not masqueraded"}
	case !via.External() && src.Kind == SourcePod:
		m = &Masquerade{false, "pod traffic to a ClusterIP keeps its source"}
	case !via.External():
		m = &Masquerade{true, "traffic to a ClusterIP from outside the pod network is masqueraded"}
	case sp.ExternalTrafficPolicy != "Local":
		m = &Masquerade{true, "externalTrafficPolicy Cluster: the endpoint sees the node's address"}
	case src.Kind == SourceNode:
		m = &Masquerade{true, "traffic from the node itself is masqueraded"}
	default:
		m = &Masquerade{false, "externalTrafficPolicy Local: the endpoint sees the client's address"}
	}
	if hairpin && !m.Masquerade {
		m.Reason += "; but if the source's own endpoint is chosen (hairpin), it is masqueraded so the reply comes back through the node"
	}
	return m
}

func addrList(addrs []netip.Addr) string {
	if len(addrs) == 0 {
		return "none known"
	}
	s := make([]string, 0, len(addrs))
	for _, a := range addrs {
		s = append(s, a.String())
	}
	return strings.Join(s, ", ")
}
