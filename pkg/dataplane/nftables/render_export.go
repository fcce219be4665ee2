package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// This file is `sluice render`'s view of the backend: the table a full sync programs,
// computed without a kernel. It builds the planner's input as Apply does (the backend's
// layout, the node IP, the local addresses) and plans against an empty table, the case of a
// first full sync on a node without the table; the plan is the one Apply streams to the
// kernel, rendered by Plan.String. render_export_test.go and the kernel test check that.

// RenderOptions are the facts a full sync learns from the node itself, which Render cannot
// read. The zero value describes a typical node.
type RenderOptions struct {
	// LocalAddresses are the node's local addresses. They matter only when nodePortAddresses
	// is not "all": @nodeport-ips then holds those inside it. nil means the node's IPs from
	// state.Node plus 127.0.0.1 and ::1.
	LocalAddresses []netip.Addr
}

// Render returns the nft script of what a full sync of state writes for cfg.Family on a
// node without the kube-proxy table: the table, its sets, maps and chains, every rule and
// element, in the order the backend sends them, with a "# namespace/name" line before each
// Service's part. `nft -f` loads it as it is. A Service the planner refuses (and the backend
// reports as failed, leaving the rest programmed) is named in a comment at the end.
func Render(state *model.NodeState, cfg dataplane.Config, opts RenderOptions) (string, error) {
	p, err := renderPlan(state, cfg, opts)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(p.String())
	names := make([]types.NamespacedName, 0, len(p.invalid))
	for name := range p.invalid {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	for _, name := range names {
		fmt.Fprintf(&b, "# Service %s is not programmed: %v\n", name, p.invalid[name])
	}
	return b.String(), nil
}

// renderPlan plans a full sync of state against an empty table, with the planner input
// Apply would build.
func renderPlan(state *model.NodeState, cfg dataplane.Config, opts RenderOptions) (*Plan, error) {
	if cfg.Family != model.IPv4 && cfg.Family != model.IPv6 {
		return nil, fmt.Errorf("nftables render: unknown IP family %v", cfg.Family)
	}
	if state == nil || state.Family != cfg.Family {
		return nil, fmt.Errorf("nftables render: want a %s state", cfg.Family)
	}
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("nftables render: masquerade bit %d out of range 0-31", cfg.MasqueradeBit)
	}
	b := &Backend{cfg: cfg, f: familyOf(cfg.Family)}
	in := &planInput{
		cfg:     b.layout(state),
		desired: state,
		full:    true,
		state:   newTableState(),
		// On an empty table no chain is stale; the kernel version does not matter.
		deleteChainsNow: true,
		prevRecords:     map[types.NamespacedName]*serviceRecord{},
		now:             time.Unix(0, 0),
	}
	if ips := state.Node.IPsOf(cfg.Family); len(ips) > 0 {
		in.nodeIP = ips[0]
	}
	if !in.cfg.nodePortMatchAll {
		in.localAddrs = opts.LocalAddresses
		if in.localAddrs == nil {
			in.localAddrs = append(slices.Clone(state.Node.IPs), netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback())
		}
	}
	return plan(in), nil
}
