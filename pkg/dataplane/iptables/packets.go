package iptables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Packets and bytes per counted Service port (issue 13; README, "Traffic counters"). They
// are counted in mangle, whose PREROUTING and OUTPUT hooks run before nat's DNAT: every
// packet of a connection's original direction still carries the address and port the
// client used there. While at least one port is counted, PREROUTING (packets not looped
// back through lo) and OUTPUT jump to chainPackets for the original direction of tracked
// connections; it holds one rule per counted address (ClusterIP, external IP, LoadBalancer
// IP, NodePort) that goes to the port's counter chain for the path, a chain holding one
// rule without target whose counters are the path's packets and bytes. A counter chain's
// rule never changes while the port is counted, so no sync rewrites it and its counts
// need no carry; only chainPackets, whose rules count nothing, is rewritten.

const (
	// chainPackets is the mangle chain of the packet counters' dispatch rules.
	chainPackets = xtables.PacketCounterChain
	// Prefixes of the counter chains (mangle), one per counted port and path.
	prefixPacketsCluster  = xtables.PacketCounterChainPrefix + "C-"
	prefixPacketsLocal    = xtables.PacketCounterChainPrefix + "L-"
	prefixPacketsExternal = xtables.PacketCounterChainPrefix + "E-"
)

// packetJumps are the rules of mangle's built-in chains that lead to chainPackets, present
// only while some port is counted. Replies are left out (the original direction only, as
// in nftables mode), and so are packets looped back through lo: they left through OUTPUT,
// where they were counted, and come back translated.
var packetJumps = []jumpRule{
	{tableMangle, "PREROUTING", chainPackets, "sluice service packet counters",
		[]string{"!", "-i", "lo", "-m", "conntrack", "--ctdir", "ORIGINAL"}},
	{tableMangle, "OUTPUT", chainPackets, "sluice service packet counters",
		[]string{"-m", "conntrack", "--ctdir", "ORIGINAL"}},
}

// packetChains returns a Counted port's packet counter chains: the ClusterIP's (path
// cluster, local under internalTrafficPolicy Local) and, when the port is reachable from
// outside, the external addresses' (NodePort, external IPs, LoadBalancer IPs).
func packetChains(sp *model.ServicePort) (internal dataplane.ChainPath, external *dataplane.ChainPath) {
	hash := portHash(sp.Name.String(), sp.Name.Protocol.Lower())
	internal = dataplane.ChainPath{Chain: prefixPacketsCluster + hash, Path: dataplane.PathCluster, EveryPacket: true}
	if sp.InternalPolicyLocal {
		internal = dataplane.ChainPath{Chain: prefixPacketsLocal + hash, Path: dataplane.PathLocal, EveryPacket: true}
	}
	if sp.ExternallyAccessible() {
		external = &dataplane.ChainPath{Chain: prefixPacketsExternal + hash, Path: dataplane.PathExternal, EveryPacket: true}
	}
	return internal, external
}

// indexedChains returns every counted chain of a Counted port: the nat path chains (new
// connections) and the mangle counter chains (packets and bytes).
func indexedChains(sp *model.ServicePort) []dataplane.ChainPath {
	out := countedChains(sp)
	internal, external := packetChains(sp)
	out = append(out, internal)
	if external != nil {
		out = append(out, *external)
	}
	return out
}

// isPacketChain reports whether a counted chain is a mangle counter chain.
func isPacketChain(chain string) bool {
	return strings.HasPrefix(chain, xtables.PacketCounterChainPrefix)
}

// packetCounters writes a Counted port's counter chains and its dispatch rules. Each
// address the port is reached on gets one rule, with the frontend's match of nat
// KUBE-SERVICES (LoadBalancer IPs only from the loadBalancerSourceRanges, which filter
// drops otherwise; NodePorts on the addresses nat takes them on). None depends on
// endpoints: an endpoint change never touches mangle.
func (pr *portRender) packetCounters() {
	sp := pr.sp
	if !sp.Counted {
		return
	}
	internal, external := packetChains(sp)
	counterRule := func(chain string) chainRules {
		return chainRules{name: chain, rules: []string{"-A " + chain + " -m comment --comment " + quoted(pr.portName+counterComment)}}
	}
	pr.s.mangleChains = append(pr.s.mangleChains, counterRule(internal.Chain))
	pr.mangle(pr.dst(sp.ClusterIP, quoted(pr.portName+" cluster IP")).add("-g", internal.Chain))
	if external == nil {
		return
	}
	pr.s.mangleChains = append(pr.s.mangleChains, counterRule(external.Chain))
	for _, ip := range sp.ExternalIPs {
		pr.mangle(pr.dst(ip, quoted(pr.portName+" external IP")).add("-g", external.Chain))
	}
	comment := quoted(pr.portName + " loadbalancer IP")
	for _, ip := range sp.LoadBalancerVIPs {
		if len(sp.LoadBalancerSourceRanges) == 0 {
			pr.mangle(pr.dst(ip, comment).add("-g", external.Chain))
			continue
		}
		allowFromNode := false
		for _, cidr := range sp.LoadBalancerSourceRanges {
			pr.mangle(pr.dst(ip, comment).add("-s", cidr.String(), "-g", external.Chain))
			if pr.rc.nodeIP.IsValid() && cidr.Contains(pr.rc.nodeIP) {
				allowFromNode = true
			}
		}
		if allowFromNode {
			for _, vip := range sp.LoadBalancerVIPs {
				pr.mangle(pr.dst(ip, comment).add("-s", vip.String(), "-g", external.Chain))
			}
		}
	}
	if sp.NodePort == 0 {
		return
	}
	nodePort := strconv.Itoa(int(sp.NodePort))
	base := func() *line {
		return (&line{}).add("-m", "comment", "--comment", quoted(pr.portName+" node port"))
	}
	tail := func(l *line) *line {
		return l.add("-m", pr.proto, "-p", pr.proto, "--dport", nodePort, "-g", external.Chain)
	}
	if pr.rc.nodePortMatchAll {
		l := base().add("-m", "addrtype", "--dst-type", "LOCAL")
		if pr.rc.family == model.IPv6 {
			l.add("!", "-d", "::1/128")
		} else if !pr.rc.localhostNodePorts {
			l.add("!", "-d", "127.0.0.0/8")
		}
		pr.mangle(tail(l))
		return
	}
	for _, ip := range pr.rc.nodePortIPs {
		if ip.IsLoopback() && (pr.rc.family == model.IPv6 || !pr.rc.localhostNodePorts) {
			continue
		}
		pr.mangle(tail(base().add("-d", ip.String())))
	}
}

func (pr *portRender) mangle(l *line) {
	pr.s.mangleTop = append(pr.s.mangleTop, topRule{chainPackets, l.String()})
}

// counting reports whether any port of desired is counted: the packet counters' jumps
// and chainPackets exist exactly then.
func counting(desired *model.NodeState) bool {
	for _, sp := range desired.Services {
		if sp.Counted {
			return true
		}
	}
	return false
}

// mangleView is what a full sync reads of mangle: which counter chains exist and hold
// their one rule, the jumps to chainPackets in the built-in chains (as iptables-save
// prints them), and whether chainPackets exists.
type mangleView struct {
	// intact are the counter chains holding exactly one rule; all are the counter
	// chains in the kernel.
	intact, all map[string]bool
	// jumps are the built-in chains' rules jumping to chainPackets.
	jumps []xtables.SavedRule
	// dispatch: chainPackets exists.
	dispatch bool
}

// mangleViewOf reads the packet counter part of a saved mangle table.
func mangleViewOf(st *xtables.SavedTable) *mangleView {
	v := &mangleView{intact: map[string]bool{}, all: map[string]bool{}}
	if st == nil {
		return v
	}
	rules := map[string]int{}
	for _, r := range st.Rules {
		rules[r.Chain]++
		if xtables.BuiltinChains[r.Chain] && r.Target() == chainPackets {
			v.jumps = append(v.jumps, r)
		}
	}
	for _, c := range st.Chains {
		switch {
		case c == chainPackets:
			v.dispatch = true
		case strings.HasPrefix(c, xtables.PacketCounterChainPrefix):
			v.all[c] = true
			if rules[c] == 1 {
				v.intact[c] = true
			}
		}
	}
	return v
}

// empty reports whether mangle holds nothing of the packet counters.
func (v *mangleView) empty() bool {
	return v == nil || !v.dispatch && len(v.all) == 0 && len(v.jumps) == 0
}

// missingJumps returns the packet jumps the kernel lacks. A jump is recognised by its
// chain and target (iptables-save may print its matches in another form).
func (v *mangleView) missingJumps() []jumpRule {
	var out []jumpRule
	for _, j := range packetJumps {
		if !slices.ContainsFunc(v.jumps, func(r xtables.SavedRule) bool { return r.Chain == j.from }) {
			out = append(out, j)
		}
	}
	return out
}

// renderFullPackets writes a full sync's packet counter lines, in mangle. While some port
// is counted: chainPackets is flushed and refilled, the counter chains the kernel lacks
// (or holds changed) are written, those of ports no longer counted deleted, and missing
// jumps inserted; a counter chain the kernel holds intact is not touched, so it keeps
// counting. Otherwise whatever the kernel holds of them is removed, jumps first; with
// nothing there, nothing is written.
func renderFullPackets(r *restoreInput, p *fullPlan) {
	global := lineOwner{}
	v := p.mangle
	if v == nil {
		v = &mangleView{}
	}
	if !p.packets {
		if v.empty() {
			return
		}
		var decls []chainDecl
		for c := range v.all {
			decls = append(decls, chainDecl{c, lineOwner{kind: lineStale, chain: c}})
		}
		if v.dispatch {
			decls = append(decls, chainDecl{chainPackets, global})
		}
		writeDecls(r, decls)
		for _, j := range v.jumps {
			r.add(global, j.Delete())
		}
		if v.dispatch {
			r.add(global, "-X "+chainPackets)
		}
		for _, c := range sortedSet(v.all) {
			r.add(lineOwner{kind: lineStale, chain: c}, "-X "+c)
		}
		return
	}
	r.add(global, declLine(chainPackets))
	active := map[string]bool{}
	var decls []chainDecl
	var fill []ownedLine
	for _, k := range p.keep {
		for _, c := range k.mangleChains {
			active[c] = true
		}
	}
	for _, s := range p.write {
		o := lineOwner{kind: lineService, service: s.name}
		for _, c := range s.mangleChains {
			active[c.name] = true
			if v.intact[c.name] {
				continue
			}
			decls = append(decls, chainDecl{c.name, o})
			for _, l := range c.rules {
				fill = append(fill, ownedLine{o, l})
			}
		}
	}
	var stale []string
	for _, c := range sortedSet(v.all) {
		if !active[c] {
			stale = append(stale, c)
			decls = append(decls, chainDecl{c, lineOwner{kind: lineStale, chain: c}})
		}
	}
	writeDecls(r, decls)
	writeOwned(r, fill)
	for _, k := range p.keep {
		r.addTop(global, k.mangleTop)
	}
	for _, s := range p.write {
		r.addTop(lineOwner{kind: lineService, service: s.name}, s.mangleTop)
	}
	for _, j := range v.missingJumps() {
		r.add(global, "-I "+j.from+" 1 "+strings.TrimPrefix(j.saveForm(), "-A "+j.from+" "))
	}
	for _, c := range stale {
		r.add(lineOwner{kind: lineStale, chain: c}, "-X "+c)
	}
}

func sortedSet(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }

// readMangle reads what mangle holds of the packet counters: one iptables-save of mangle
// (a small table unless many ports are counted) in the legacy flavour; in the nft flavour,
// whose iptables-nft-save translates the whole ruleset back whatever table it is asked
// for (over 30 s at 10 000 Services x 10 endpoints), netlink and `iptables -S` of the two
// built-in chains the jumps live in.
func (b *Backend) readMangle(ctx context.Context) (*mangleView, error) {
	if b.netlinkReads() {
		return b.readMangleNFT()
	}
	saved, err := xtables.ReadSaved(ctx, b.tools, tableMangle)
	if err != nil {
		return nil, err
	}
	return mangleViewOf(saved[tableMangle]), nil
}

// readMangleNFT is readMangle in the nft flavour: mangle's chains listed over netlink,
// the rules of its counter chains counted over netlink (a request per chain), the
// built-in chains' rules listed with iptables.
func (b *Backend) readMangleNFT() (*mangleView, error) {
	v := &mangleView{intact: map[string]bool{}, all: map[string]bool{}}
	chains, err := xtables.ListNFTChains(b.cfg.Family, tableMangle)
	if err != nil {
		return nil, err
	}
	for c := range chains {
		switch {
		case c == chainPackets:
			v.dispatch = true
		case strings.HasPrefix(c, xtables.PacketCounterChainPrefix):
			v.all[c] = true
		}
	}
	if len(v.all) > 0 {
		read, err := xtables.ReadNFTCounters(b.cfg.Family, tableMangle, sortedSet(v.all))
		if err != nil {
			return nil, err
		}
		for c, n := range read {
			if n.Rules == 1 {
				v.intact[c] = true
			}
		}
	}
	for _, j := range packetJumps {
		if !chains[j.from] {
			continue // no mangle table yet
		}
		lines, err := b.editor.List(tableMangle, j.from)
		if err != nil {
			return nil, fmt.Errorf("listing %s %s: %w", tableMangle, j.from, err)
		}
		for _, l := range lines {
			if r := (xtables.SavedRule{Chain: j.from, Line: l}); strings.HasPrefix(l, "-A ") && r.Target() == chainPackets {
				v.jumps = append(v.jumps, r)
			}
		}
	}
	return v, nil
}
