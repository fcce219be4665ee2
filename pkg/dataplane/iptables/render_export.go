package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// This file is `sluice render`'s view of the backend: the ruleset a full sync programs,
// computed without a kernel. It calls the functions Apply's full sync calls (newRenderConfig,
// renderStatic, renderService, renderFull, and the jumpRules ensureJumps walks), so the two
// cannot disagree; render_export_test.go checks that against the fake kernel.

// RenderOptions are the facts a full sync learns from the node itself (interfaces, sysctls,
// kernel modules), which Render cannot read. The zero value describes a typical node.
type RenderOptions struct {
	// LocalAddresses are the node's local addresses. They matter only when nodePortAddresses
	// is not "all": NodePorts then answer on the local addresses inside it. nil means the
	// node's IPs from state.Node plus 127.0.0.1 and ::1.
	LocalAddresses []netip.Addr
	// TCPBeLiberal says nf_conntrack_tcp_be_liberal is 1: the ctstate INVALID drop rule is
	// then left out.
	TCPBeLiberal bool
	// NFAcct says the kernel has nfacct: the INVALID drop (and localhost NodePort) rules then
	// also count packets.
	NFAcct bool
}

// Render returns what a full sync of state programs on a node that holds no sluice or
// kube-proxy rule yet, for cfg.Family:
//
//   - first, as "#" comment lines, the iptables commands the backend runs before the restore
//     (it creates the chains its jumps lead to and inserts each jump at the top of its
//     built-in chain, when missing);
//   - then the exact input the backend feeds to iptables-restore --noflush: the canary in
//     mangle, nat, then filter.
//
// With the comment lines removed, the text is byte for byte the restore input; with them it
// is still valid iptables-restore input. The iptables flavour does not change it. One
// difference is not shown: in the nft flavour a ruleset of more than 2 000 chains is
// written in several restores (the Services' chains first, in batches), which program the
// same rules.
func Render(state *model.NodeState, cfg dataplane.Config, opts RenderOptions) (string, error) {
	if cfg.Family != model.IPv4 && cfg.Family != model.IPv6 {
		return "", fmt.Errorf("iptables render: unknown IP family %v", cfg.Family)
	}
	if state == nil || state.Family != cfg.Family {
		return "", fmt.Errorf("iptables render: want a %s state", cfg.Family)
	}
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return "", fmt.Errorf("iptables render: masquerade bit %d out of range 0-31", cfg.MasqueradeBit)
	}
	localAddrs := opts.LocalAddresses
	if localAddrs == nil {
		localAddrs = append(slices.Clone(state.Node.IPs), netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback())
	}

	var b strings.Builder
	b.WriteString("# Before the restore: the chains the jumps lead to and the jumps from the built-in chains\n")
	b.WriteString("# (each created or inserted only when missing):\n")
	for _, cmd := range jumpCommands(cfg.Family) {
		b.WriteString("#   " + cmd + "\n")
	}
	b.WriteString("# iptables-restore --noflush input:\n")
	b.WriteString(renderFullSync(state, cfg, localAddrs, opts.TCPBeLiberal, opts.NFAcct).String())
	return b.String(), nil
}

// renderFullSync builds the restore input of a full sync on an empty kernel, as syncFull
// does: every Service written, none held back or prestaged, no stale chain.
func renderFullSync(state *model.NodeState, cfg dataplane.Config, localAddrs []netip.Addr, tcpLiberal, nfacct bool) *restoreInput {
	endpoints := 0
	for _, sp := range state.Services {
		endpoints += len(sp.AllEndpoints)
	}
	rc := newRenderConfig(cfg, state.Node, localAddrs, tcpLiberal, nfacct, endpoints)
	p := &fullPlan{static: renderStatic(rc), canary: true, packets: counting(state)}
	names := state.ServiceNames().UnsortedList()
	slices.SortFunc(names, compareNames)
	for _, name := range names {
		p.write = append(p.write, renderService(rc, name, state.PortsOf(name)))
	}
	return renderFull(p)
}

// jumpCommands returns what ensureJumps runs on a kernel without any of sluice's chains,
// in its order, as iptables command lines.
func jumpCommands(family model.IPFamily) []string {
	program := "iptables"
	if family == model.IPv6 {
		program = "ip6tables"
	}
	created := map[string]bool{}
	var out []string
	for _, j := range append(append([]jumpRule(nil), jumpRules...), kubeletJumpRules...) {
		if !created[j.table+"/"+j.to] {
			created[j.table+"/"+j.to] = true
			out = append(out, fmt.Sprintf("%s -t %s -N %s", program, j.table, j.to))
		}
		out = append(out, fmt.Sprintf("%s -t %s -I %s 1 %s", program, j.table, j.from, shellArgs(j.spec())))
	}
	return out
}

// shellArgs joins arguments as a shell and iptables-restore read them back: an argument
// with blanks in double quotes.
func shellArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \t") {
			a = `"` + a + `"`
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
