package xtables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Which chains are kube-proxy's, and so sluice's: the iptables and ipvs modes of upstream
// and of sluice use the same names, so that a node can move between them in any direction
// and each side recognises, rewrites or removes the other's chains. This is the one place
// that says so; each backend keeps the list of what it writes, in its order, and a test
// there checks that its own chains are its mode's here.
//
// Ownership is by table: a chain is kube-proxy's in the table where one of its modes
// creates it, nowhere else. Kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
// KUBE-MARK-DROP, KUBE-IPTABLES-HINT) are never kube-proxy's, and neither is anything
// without the KUBE- prefix, but for sluice's own traffic counter chains (issue 13, written
// only while a Service's traffic is counted): the packet counters in mangle
// (PacketCounterChain, PacketCounterChainPrefix) and the new-connection counters in nat
// (NewConnCounterChainPrefix), which the iptables mode owns like its other chains, so
// that a switch to another mode and `sluice --cleanup` remove them.

// iptablesModeChains are the fixed chains of the iptables mode, by table.
var iptablesModeChains = map[string][]string{
	TableNAT:    {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY"},
	TableFilter: {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY"},
	TableMangle: {"KUBE-PROXY-CANARY", PacketCounterChain},
}

// PacketCounterChain (mangle) is jumped to from PREROUTING and OUTPUT while a Service's
// traffic is counted, and sends each packet to a Service port to its counter chain;
// PacketCounterChainPrefix starts the names of those counter chains (mangle).
const (
	PacketCounterChain       = "SLUICE-SERVICE-PACKETS"
	PacketCounterChainPrefix = "SLUICE-PKT"
)

// NewConnCounterChainPrefix starts the names of the new-connection counter chains (nat):
// a counted Service port's path chain (KUBE-SVC, KUBE-SVL, KUBE-EXT) jumps to its own
// one first, which holds one rule counting what enters the path.
const NewConnCounterChainPrefix = "SLUICE-NEW"

// ipvsModeChains are the chains of the ipvs mode, by table.
var ipvsModeChains = map[string][]string{
	TableNAT:    {"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ"},
	TableFilter: {"KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"},
}

// ServiceChainPrefixes start the names of the iptables mode's per-Service-port chains, all
// in nat: KUBE-SVC- (endpoints for Cluster traffic policy), KUBE-SVL- (Local policy),
// KUBE-EXT- (external traffic), KUBE-FW- (loadBalancerSourceRanges), KUBE-SEP- (one
// endpoint).
var ServiceChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"}

// oldServiceChainPrefix is KUBE-XLB-, the Local policy chains of kube-proxy before 1.24:
// never written any more, still removed.
const oldServiceChainPrefix = "KUBE-XLB-"

// IsServiceChain reports whether chain is one of the iptables mode's per-Service-port
// chains (of any kube-proxy version).
func IsServiceChain(chain string) bool {
	for _, p := range ServiceChainPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return strings.HasPrefix(chain, oldServiceChainPrefix)
}

// IPTablesModeChain reports whether the iptables mode owns chain in table.
func IPTablesModeChain(table, chain string) bool {
	return slices.Contains(iptablesModeChains[table], chain) ||
		table == TableNAT && (IsServiceChain(chain) || strings.HasPrefix(chain, NewConnCounterChainPrefix)) ||
		table == TableMangle && strings.HasPrefix(chain, PacketCounterChainPrefix)
}

// IPVSModeChain reports whether the ipvs mode owns chain in table.
func IPVSModeChain(table, chain string) bool {
	return slices.Contains(ipvsModeChains[table], chain)
}

// KubeProxyChain reports whether either mode owns chain in table.
func KubeProxyChain(table, chain string) bool {
	return IPTablesModeChain(table, chain) || IPVSModeChain(table, chain)
}

// BuiltinChains are the chains every table may have without declaring them.
var BuiltinChains = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

// RemoveChains removes from one flavour the chains owned(table, chain) selects, with the
// rules of the built-in chains that jump to them, and returns how many chains it deleted.
// It reads every table with iptables-save (slow for a large iptables-nft ruleset,
// acceptable once), then writes two steps: one restore that deletes the jumps and flushes
// every chain to remove (chains to remove may jump to each other, so all are emptied
// before any is deleted), then restores that delete them, at most maxPerRestore chains
// each (0: no bound; iptables-nft's cost grows with the square of the chains one restore
// touches).
//
// A chain to remove that a rule of another program's chain still jumps to is flushed and
// kept: deleting that rule would change the other program's rules, and deleting the chain
// under it would fail the whole restore. The built-in chains' jumps are kube-proxy's and
// go.
func RemoveChains(ctx context.Context, r Runner, owned func(table, chain string) bool, maxPerRestore int) (removed int, err error) {
	saved, err := ReadSaved(ctx, r)
	if err != nil {
		return 0, err
	}
	plan := planRemoval(saved, owned)
	if len(plan) == 0 {
		return 0, nil
	}
	if err := r.Restore(ctx, plan.unlinkInput()); err != nil {
		return 0, fmt.Errorf("flushing kube-proxy chains: %w", err)
	}
	for _, in := range plan.deleteInputs(maxPerRestore) {
		if err := r.Restore(ctx, in.text); err != nil {
			return removed, fmt.Errorf("deleting kube-proxy chains: %w", err)
		}
		removed += in.chains
	}
	return removed, nil
}

// tableRemoval is what RemoveChains does in one table.
type tableRemoval struct {
	table string
	// flush are the chains to empty, delete those of them to delete.
	flush, delete []string
	// unlink are the "-D" lines of the built-in chains' jumps.
	unlink []string
}

type removalPlan []tableRemoval

// planRemoval decides, from what iptables-save printed, what RemoveChains writes, table
// by table in name order.
func planRemoval(saved Saved, owned func(table, chain string) bool) removalPlan {
	var plan removalPlan
	for _, table := range sortedKeys(saved) {
		st := saved[table]
		remove := map[string]bool{}
		for _, c := range st.Chains {
			if !BuiltinChains[c] && owned(table, c) {
				remove[c] = true
			}
		}
		tr := tableRemoval{table: table}
		kept := map[string]bool{}
		for _, r := range st.Rules {
			switch target := r.Target(); {
			case !remove[target] || remove[r.Chain]:
			case BuiltinChains[r.Chain]:
				tr.unlink = append(tr.unlink, r.Delete())
			default:
				kept[target] = true
			}
		}
		for c := range remove {
			tr.flush = append(tr.flush, c)
			if !kept[c] {
				tr.delete = append(tr.delete, c)
			}
		}
		if len(tr.flush)+len(tr.unlink) == 0 {
			continue
		}
		// Reverse name order: both flavours keep chains in a sorted list walked from the
		// front (see the iptables backend's writeDecls).
		slices.SortFunc(tr.flush, func(a, b string) int { return strings.Compare(b, a) })
		slices.Sort(tr.delete)
		plan = append(plan, tr)
	}
	return plan
}

// unlinkInput is the first restore: jumps deleted, chains flushed.
func (p removalPlan) unlinkInput() []byte {
	var b strings.Builder
	for _, tr := range p {
		b.WriteString("*" + tr.table + "\n")
		for _, c := range tr.flush {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		for _, l := range tr.unlink {
			b.WriteString(l + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

type deleteInput struct {
	text   []byte
	chains int
}

// deleteInputs are the restores that delete the chains, at most max each (0: one).
func (p removalPlan) deleteInputs(max int) []deleteInput {
	var out []deleteInput
	var b strings.Builder
	n, table := 0, ""
	flush := func() {
		if n == 0 {
			return
		}
		b.WriteString("COMMIT\n")
		out = append(out, deleteInput{text: []byte(b.String()), chains: n})
		b.Reset()
		n, table = 0, ""
	}
	for _, tr := range p {
		for _, c := range tr.delete {
			if max > 0 && n == max {
				flush()
			}
			if table != tr.table {
				if table != "" {
					b.WriteString("COMMIT\n")
				}
				table = tr.table
				b.WriteString("*" + table + "\n")
			}
			b.WriteString("-X " + c + "\n")
			n++
		}
	}
	flush()
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// RemoveChainsPerRestore bounds the chains one restore of RemoveChains deletes when a
// whole ruleset goes (a cleanup, leftovers of another mode): iptables-nft's cost per
// restore grows with the square of the chains it touches.
const RemoveChainsPerRestore = 5000
