package ipvs

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// The iptables ruleset around IPVS, rendered as iptables-restore input. IPVS itself does the
// load balancing; these rules only decide what to masquerade, which sources the firewall
// lets in, and what else may reach the Service addresses the node holds. The rules depend
// on the ipsets' contents only through the sets, so they rarely change: a sync writes them
// when their text changes, and every full sync writes them (with the jump rules and the
// leftovers of other modes) to repair drift.

// ruleConfig is what the rules depend on besides the Services.
type ruleConfig struct {
	family        model.IPFamily
	markBit       int
	masqueradeAll bool
	detector      dataplane.LocalDetector
}

// ruleset holds the rules of the backend's own chains, as "-A CHAIN ..." lines, per table.
type ruleset struct {
	nat, filter []string
}

// text is the ruleset as one string, to tell whether it changed.
func (r *ruleset) text() string {
	return strings.Join(r.nat, "\n") + "\n--\n" + strings.Join(r.filter, "\n")
}

// masqueradeMark formats the mark bit as upstream's ipvs mode does ("%#08x": 0x00004000 for
// bit 14; Go does not count the 0x in the width).
func masqueradeMark(bit int) string { return fmt.Sprintf("%#08x", uint32(1)<<uint(bit)) }

// renderRules renders upstream's ipvs-mode rules (writeIptablesRules) for one family, in its
// order, with two differences: the rules that match an ipset are written whether or not the
// set is empty (so the ruleset does not change with the Services), and sluice's
// KUBE-SLUICE-NO-LOCAL-EPS rules drop outside traffic to externalTrafficPolicy Local
// frontends without local endpoints.
func renderRules(cfg ruleConfig, outFilter []outFilterRule) *ruleset {
	w := &ruleWriter{cfg: cfg, rs: &ruleset{}, mark: masqueradeMark(cfg.markBit)}
	w.setTargets()
	w.masquerade()
	w.outFilter(outFilter)
	w.acceptAndFilter()
	w.postrouting()
	return w.rs
}

// ruleWriter appends one family's rules to a ruleset, in the order renderRules calls its
// phases.
type ruleWriter struct {
	cfg  ruleConfig
	rs   *ruleset
	mark string
}

func (w *ruleWriter) nat(chain string, args ...[]string) {
	w.rs.nat = append(w.rs.nat, line(chain, args...))
}
func (w *ruleWriter) filter(chain string, args ...[]string) {
	w.rs.filter = append(w.rs.filter, line(chain, args...))
}

// matchSet matches a set of this family in the given directions.
func (w *ruleWriter) matchSet(id ipsetID, dirs string) []string {
	return []string{"-m", "set", "--match-set", ipsetName(id, w.cfg.family), dirs}
}

// withComment is matchSet preceded by the set's comment.
func (w *ruleWriter) withComment(id ipsetID, dirs string) []string {
	return append([]string{"-m", "comment", "--comment", ipsets[id].comment}, w.matchSet(id, dirs)...)
}

func jump(target string) []string { return []string{"-j", target} }

// setTargets: loopback returns, then the sets that lead to a chain (upstream's
// ipsetWithIptablesChain, in its order) and sluice's no-local-endpoints rules.
func (w *ruleWriter) setTargets() {
	loopback := "127.0.0.0/8"
	if w.cfg.family == model.IPv6 {
		loopback = "::1/128"
	}
	w.nat(chainServices, []string{"-s", loopback}, jump("RETURN"))

	// Sets that lead somewhere (upstream's ipsetWithIptablesChain, in its order).
	w.nat(chainPostrouting, w.withComment(setLoopBack, "dst,dst,src"), jump("MASQUERADE"))
	w.nat(chainServices, w.withComment(setLoadBalancer, "dst,dst"), jump(chainLoadBalancer))
	w.nat(chainLoadBalancer, w.withComment(setLoadBalancerLocal, "dst,dst"), jump("RETURN"))
	for _, np := range []struct {
		proto      string
		local, all ipsetID
		dirs       string
	}{
		{"tcp", setNodePortLocalTCP, setNodePortTCP, "dst"},
		{"udp", setNodePortLocalUDP, setNodePortUDP, "dst"},
		{"sctp", setNodePortLocalSCTP, setNodePortSCTP, "dst,dst"},
	} {
		w.nat(chainNodePort, []string{"-p", np.proto}, w.withComment(np.local, np.dirs), jump("RETURN"))
		w.nat(chainNodePort, []string{"-p", np.proto}, w.withComment(np.all, np.dirs), jump(chainMarkMasq))
	}
	w.filter(chainProxyFirewall, w.withComment(setLoadBalancerFW, "dst,dst"), jump(chainSourceRangesFirewall))
	w.filter(chainSourceRangesFirewall, w.withComment(setLoadBalancerSourceCIDR, "dst,dst,src"), jump("RETURN"))
	w.filter(chainSourceRangesFirewall, w.withComment(setLoadBalancerSourceIP, "dst,dst,src"), jump("RETURN"))

	// sluice: externalTrafficPolicy Local without local endpoints. Pods (by the local
	// detector) and the node itself reach the cluster's endpoints, everyone else is dropped.
	if local, _ := xtables.LocalMatches(w.cfg.detector); local != nil {
		w.filter(chainProxyFirewall, w.withComment(setNoLocalEndpoints, "dst,dst"), local, jump("RETURN"))
	}
	w.filter(chainProxyFirewall, w.withComment(setNoLocalEndpoints, "dst,dst"),
		[]string{"-m", "addrtype", "!", "--src-type", "LOCAL"}, jump("DROP"))
	// The node itself reaching such a frontend goes to another node's endpoint; from an
	// externalIP or LB IP its source is that address, which the other node holds too, so
	// the reply would never come back: masquerade it (upstream leaves it broken).
	w.nat(chainServices, w.withComment(setNoLocalEndpoints, "dst,dst"), []string{"-m", "addrtype", "--src-type", "LOCAL"}, jump(chainMarkMasq))
}

// masquerade: which ClusterIP and externalIP traffic is masqueraded or accepted, and the
// jumps to the NodePort, load-balancer and source-range chains' ends.
func (w *ruleWriter) masquerade() {
	// ClusterIPs: masquerade what does not come from a pod.
	switch _, notLocal := xtables.LocalMatches(w.cfg.detector); {
	case w.cfg.masqueradeAll:
		w.nat(chainServices, w.withComment(setClusterIP, "dst,dst"), jump(chainMarkMasq))
	case notLocal != nil:
		w.nat(chainServices, w.withComment(setClusterIP, "dst,dst"), notLocal, jump(chainMarkMasq))
	default:
		// Without a detector, masquerade traffic the node sends from a Service address: the
		// dummy device makes the kernel pick a VIP as the source of connections to VIPs.
		w.nat(chainServices, w.withComment(setClusterIP, "src,dst"), jump(chainMarkMasq))
	}

	// externalIPs: masquerade (Cluster policy), and accept what comes from outside the node
	// or to an address the node holds.
	externalAccept := func(id ipsetID) {
		w.nat(chainServices, w.withComment(id, "dst,dst"), []string{"-m", "physdev", "!", "--physdev-is-in", "-m", "addrtype", "!", "--src-type", "LOCAL"}, jump("ACCEPT"))
		w.nat(chainServices, w.withComment(id, "dst,dst"), []string{"-m", "addrtype", "--dst-type", "LOCAL"}, jump("ACCEPT"))
	}
	w.nat(chainServices, w.withComment(setExternalIP, "dst,dst"), jump(chainMarkMasq))
	externalAccept(setExternalIP)
	externalAccept(setExternalIPLocal)

	w.nat(chainServices, []string{"-m", "addrtype", "--dst-type", "LOCAL"}, jump(chainNodePort))
	w.nat(chainLoadBalancer, jump(chainMarkMasq))
	w.filter(chainSourceRangesFirewall, jump("DROP"))
}

// outFilter drops traffic the node sends to an LB IP whose source ranges leave the node out.
func (w *ruleWriter) outFilter(outFilter []outFilterRule) {
	for _, f := range outFilter {
		w.filter(chainIPVSOutFilter, []string{"-s", f.addr.String(), "-m", "ipvs", "--vaddr", f.addr.String(),
			"--vproto", strings.ToLower(string(f.proto)), "--vport", strconv.Itoa(int(f.port))}, jump("DROP"))
	}
}

// acceptAndFilter: accept traffic to virtual servers, forward marked and established
// traffic, and refuse everything else on the dummy device's addresses.
func (w *ruleWriter) acceptAndFilter() {
	mark := w.mark
	// Accept traffic to virtual servers, whatever other rules say (at the end of KUBE-SERVICES).
	w.nat(chainServices, w.matchSet(setClusterIP, "dst,dst"), jump("ACCEPT"))
	w.nat(chainServices, w.matchSet(setLoadBalancer, "dst,dst"), jump("ACCEPT"))

	w.filter(chainForward, []string{"-m", "comment", "--comment", "kubernetes forwarding rules", "-m", "mark", "--mark", mark + "/" + mark}, jump("ACCEPT"))
	w.filter(chainForward, []string{"-m", "comment", "--comment", "kubernetes forwarding conntrack rule", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"}, jump("ACCEPT"))
	w.filter(chainNodePort, w.withComment(setHealthCheckNodePort, "dst"), jump("ACCEPT"))

	// sluice: a TCP virtual server without a real server is refused with a reset before IPVS
	// sees the SYN (IPVS's own answer, ICMP port unreachable, leaves an IPv6 client waiting
	// for its SYN retransmit). Connections the node itself opens meet IPVS in OUTPUT, before
	// any filter rule may REJECT, and still get IPVS's answer.
	w.filter(chainIPVSFilter, []string{"-p", "tcp", "-m", "conntrack", "--ctstate", "NEW"}, w.withComment(setNoEndpointsTCP, "dst,dst"),
		[]string{"-j", "REJECT", "--reject-with", "tcp-reset"})

	// Nothing but the Services' ports answers on the addresses the dummy device holds
	// (https://issues.k8s.io/72236).
	w.filter(chainIPVSFilter, w.matchSet(setLoadBalancer, "dst,dst"), jump("RETURN"))
	w.filter(chainIPVSFilter, w.matchSet(setClusterIP, "dst,dst"), jump("RETURN"))
	w.filter(chainIPVSFilter, w.matchSet(setExternalIP, "dst,dst"), jump("RETURN"))
	w.filter(chainIPVSFilter, w.matchSet(setExternalIPLocal, "dst,dst"), jump("RETURN"))
	w.filter(chainIPVSFilter, w.matchSet(setHealthCheckNodePort, "dst"), jump("RETURN"))
	// TCP is refused with a reset, the rest with REJECT's ICMP port unreachable: Linux TCP
	// takes an ICMP error that arrives while connect() holds the socket as a soft error,
	// so a client (IPv6 ones typically) would wait for a SYN retransmit.
	w.filter(chainIPVSFilter, []string{"-p", "tcp", "-m", "conntrack", "--ctstate", "NEW"}, w.matchSet(setIPVSIPs, "dst"),
		[]string{"-j", "REJECT", "--reject-with", "tcp-reset"})
	w.filter(chainIPVSFilter, []string{"-m", "conntrack", "--ctstate", "NEW"}, w.matchSet(setIPVSIPs, "dst"), jump("REJECT"))
}

// postrouting masquerades marked traffic.
func (w *ruleWriter) postrouting() {
	mark := w.mark
	w.nat(chainPostrouting, []string{"-m", "mark", "!", "--mark", mark + "/" + mark}, jump("RETURN"))
	w.nat(chainPostrouting, []string{"-j", "MARK", "--xor-mark", mark})
	w.nat(chainPostrouting, []string{"-m", "comment", "--comment", "kubernetes service traffic requiring SNAT", "-j", "MASQUERADE", "--random-fully"})
	w.nat(chainMarkMasq, []string{"-j", "MARK", "--or-mark", mark})
}

// line renders "-A chain args..." with arguments quoted as iptables-save does.
func line(chain string, args ...[]string) string {
	var b strings.Builder
	b.WriteString("-A ")
	b.WriteString(chain)
	for _, group := range args {
		for _, a := range group {
			b.WriteByte(' ')
			b.WriteString(quote(a))
		}
	}
	return b.String()
}

func quote(a string) string {
	if a == "" || strings.ContainsAny(a, " \t\"\\'") {
		return strconv.Quote(a)
	}
	return a
}

// tableFixes are the changes a full sync makes to one table besides its own chains: rules
// deleted from built-in chains (stale jumps), jump rules inserted, leftover chains removed.
type tableFixes struct {
	deleteRules  []string
	insertJumps  []string
	removeChains []string
}

func (f *tableFixes) empty() bool {
	return f == nil || len(f.deleteRules) == 0 && len(f.insertJumps) == 0 && len(f.removeChains) == 0
}

// planFixes compares what iptables-save shows with the backend's layout: jump rules that are
// missing get inserted at the top of their chain, any other rule of a built-in chain that
// leads into a kube-proxy chain (the iptables mode's jumps, duplicates) is deleted, and the
// kube-proxy chains this mode does not use (KUBE-SVC-*, KUBE-NODEPORTS, the canaries ...)
// are removed, in the same restore that writes the rules, so nothing is left unserved.
func planFixes(saved xtables.Saved) map[string]*tableFixes {
	out := map[string]*tableFixes{}
	for _, table := range []string{tableNAT, tableFilter, tableMangle} {
		f := &tableFixes{}
		out[table] = f
		st := saved[table]
		remove := map[string]bool{}
		if st != nil {
			for _, c := range st.Chains {
				if !builtinChains[c] && xtables.KubeProxyChain(table, c) && !xtables.IPVSModeChain(table, c) {
					remove[c] = true
					f.removeChains = append(f.removeChains, c)
				}
			}
		}
		matched := make([]bool, len(jumpRules))
		if st != nil {
			for _, r := range st.Rules {
				if !builtinChains[r.Chain] {
					continue
				}
				target := r.Target()
				if !remove[target] && !slices.Contains(ownChains[table], target) {
					continue
				}
				keep := false
				for i, j := range jumpRules {
					if !matched[i] && j.table == table && j.from == r.Chain && j.to == target && slices.Equal(j.args(), r.Args()) {
						matched[i], keep = true, true
						break
					}
				}
				if !keep {
					f.deleteRules = append(f.deleteRules, r.Delete())
				}
			}
		}
		for i, j := range jumpRules {
			if j.table == table && !matched[i] {
				f.insertJumps = append(f.insertJumps, strings.Replace(line(j.from, j.args()), "-A "+j.from, "-I "+j.from+" 1", 1))
			}
		}
	}
	return out
}

// restoreInput renders the iptables-restore input that writes rs (declaring a chain
// flushes it) with fixes applied (nil for a partial sync).
func restoreInput(rs *ruleset, fixes map[string]*tableFixes) []byte {
	var b bytes.Buffer
	write := func(table string, rules []string) {
		f := fixes[table]
		if rules == nil && f.empty() {
			return
		}
		b.WriteString("*" + table + "\n")
		for _, c := range ownChains[table] {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		if f != nil {
			for _, c := range f.removeChains {
				b.WriteString(":" + c + " - [0:0]\n")
			}
			for _, l := range f.deleteRules {
				b.WriteString(l + "\n")
			}
			for _, l := range f.insertJumps {
				b.WriteString(l + "\n")
			}
		}
		for _, l := range rules {
			b.WriteString(l + "\n")
		}
		if f != nil {
			for _, c := range f.removeChains {
				b.WriteString("-X " + c + "\n")
			}
		}
		b.WriteString("COMMIT\n")
	}
	write(tableNAT, rs.nat)
	write(tableFilter, rs.filter)
	if f := fixes[tableMangle]; !f.empty() {
		b.WriteString("*" + tableMangle + "\n")
		for _, c := range f.removeChains {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		for _, l := range f.deleteRules {
			b.WriteString(l + "\n")
		}
		for _, c := range f.removeChains {
			b.WriteString("-X " + c + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}

// flushOwnChainsInput renders iptables-restore input that empties the backend's chains.
func flushOwnChainsInput() []byte {
	var b bytes.Buffer
	for _, table := range []string{tableNAT, tableFilter} {
		b.WriteString("*" + table + "\n")
		for _, c := range ownChains[table] {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}
