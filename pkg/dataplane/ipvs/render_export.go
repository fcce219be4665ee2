package ipvs

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

// This file is `sluice render`'s view of the backend: what a full sync programs, computed
// without a kernel. It runs what Apply's full sync runs against a node that holds nothing
// yet (makeEnv, buildRecord, makePlan on an empty kernel view, renderRules, restoreInput
// with the jump fixes planFixes finds for empty tables) and prints the plan's operations
// as the equivalent ip, ipset, ipvsadm and iptables-restore commands.
// render_export_test.go checks it against the calls the backend makes on the fake kernel.

// RenderOptions are the facts a full sync learns from the node itself, which Render cannot
// read. The zero value describes a typical node.
type RenderOptions struct {
	// LocalAddresses are the node's local addresses (other than kube-ipvs0's): NodePorts
	// listen on those inside nodePortAddresses, and an externalIP or LoadBalancer IP among
	// them is not added to kube-ipvs0. nil means the node's IPs from state.Node plus
	// 127.0.0.1 and ::1.
	LocalAddresses []netip.Addr
}

// renderedSync is a full sync on an empty node: the plan, and the iptables-restore input
// run between the plan's adds and deletes.
type renderedSync struct {
	family  model.IPFamily
	plan    *plan
	restore []byte
}

// Render returns, for cfg.Family, what a full sync of state does on a node that holds no
// IPVS virtual server, kube-ipvs0, ipset or rule of sluice's or kube-proxy's yet, in the
// order the backend does it, as commands that would do the same:
//
//	ip link add kube-ipvs0 type dummy, ipset create ...     the device and the ipsets
//	# namespace/name, ipvsadm -A ..., ipvsadm -a ... -m -w 1  each Service's virtual and real servers
//	ip addr add ... dev kube-ipvs0, ipset add ...            addresses and set entries
//	iptables-restore --noflush <<'EOF' ... EOF               the rules, with the jumps from the built-in chains
//
// The backend does all of it over netlink, not with these programs. A frontend that two
// Services want goes to the first by name; the other is programmed without it,
// and a "left out" comment in its part says so.
// The sysctls and IPVS timeouts the backend sets at start are not shown.
func Render(state *model.NodeState, cfg dataplane.Config, settings Settings, opts RenderOptions) (string, error) {
	r, err := renderSync(state, cfg, settings, opts)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}

// renderSync plans a full sync of state on an empty node with the inputs Apply would use.
func renderSync(state *model.NodeState, cfg dataplane.Config, settings Settings, opts RenderOptions) (*renderedSync, error) {
	settings, err := checkInputs(cfg, settings)
	if err != nil {
		return nil, fmt.Errorf("ipvs render: %w", err)
	}
	if state == nil || state.Family != cfg.Family {
		return nil, fmt.Errorf("ipvs render: want a %s state", cfg.Family)
	}

	addrs := opts.LocalAddresses
	if addrs == nil {
		addrs = append(slices.Clone(state.Node.IPs), netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback())
	}
	local := make([]linkAddr, 0, len(addrs))
	for _, a := range addrs {
		link := "eth0" // any link but the dummy device
		if a.IsLoopback() {
			link = "lo"
		}
		local = append(local, linkAddr{addr: a.Unmap(), link: link})
	}

	// Apply's full sync on a backend that has synced nothing: a fresh index, every Service
	// in scope, nothing in the kernel.
	b := &Backend{cfg: cfg, settings: settings}
	env := b.makeEnv(local, state)
	scope := state.ServiceNames()
	records := map[types.NamespacedName]*serviceRecord{}
	for name := range scope {
		if ports := state.PortsOf(name); len(ports) > 0 {
			records[name] = buildRecord(ports, env)
		}
	}
	idx := newDesiredIndex()
	p := makePlan(&planInput{
		family:  cfg.Family,
		full:    true,
		records: records,
		scope:   scope,
		kernel:  newKernelView(),
		exclude: settings.ExcludeCIDRs,
	}, idx)
	rs := renderRules(ruleConfig{
		family: cfg.Family, markBit: cfg.MasqueradeBit, masqueradeAll: cfg.MasqueradeAll, detector: cfg.LocalDetector,
	}, idx.outFilterRules())
	// iptables-save of tables holding only their built-in chains parses to no rule and no
	// chain of ours: every jump is missing and nothing is left over.
	restore := restoreInput(rs, planFixes(xtables.Saved{}))
	return &renderedSync{family: cfg.Family, plan: p, restore: restore}, nil
}

// String renders the sync as commands, in the order the backend runs them.
func (r *renderedSync) String() string {
	var b strings.Builder
	line := func(s string) { b.WriteString(s + "\n") }
	if len(r.plan.setup) > 0 {
		line("# The dummy device and the ipsets:")
		for _, o := range r.plan.setup {
			line(r.command(o))
		}
	}
	for _, so := range r.plan.services {
		line("# " + so.name.String())
		for _, err := range so.errs {
			line("#   left out: " + err.Error())
		}
		for _, o := range so.ops {
			line(r.command(o))
		}
	}
	if len(r.plan.adds) > 0 {
		line("# Addresses on " + dummyDevice + " and ipset entries:")
		for _, o := range r.plan.adds {
			line(r.command(o))
		}
	}
	program := "iptables-restore"
	if r.family == model.IPv6 {
		program = "ip6tables-restore"
	}
	line("# The iptables rules around IPVS:")
	line(program + " --noflush <<'EOF'")
	b.Write(r.restore)
	line("EOF")
	if len(r.plan.deletes) > 0 {
		line("# Removed last:")
		for _, o := range r.plan.deletes {
			line(r.command(o))
		}
	}
	return b.String()
}

// command spells one operation as the ip, ipset or ipvsadm command that does the same.
func (r *renderedSync) command(o op) string {
	set := func() string { return ipsetName(o.set, r.family) }
	switch o.kind {
	case opCreateLink:
		return "ip link add " + dummyDevice + " type dummy"
	case opCreateSet:
		return ipsetCreate(set(), ipsets[o.set].typ, r.family)
	case opRecreateSet:
		return "ipset destroy " + set() + "\n" + ipsetCreate(set(), ipsets[o.set].typ, r.family)
	case opAddVS:
		return "ipvsadm -A " + virtualServer(o.vs) + " " + serviceOptions(o.params)
	case opUpdateVS:
		return "ipvsadm -E " + virtualServer(o.vs) + " " + serviceOptions(o.params)
	case opDeleteVS:
		return "ipvsadm -D " + virtualServer(o.vs)
	case opAddRS:
		return fmt.Sprintf("ipvsadm -a %s -r %s -m -w %d", virtualServer(o.vs), o.rs, o.weight)
	case opUpdateRS:
		return fmt.Sprintf("ipvsadm -e %s -r %s -m -w %d", virtualServer(o.vs), o.rs, o.weight)
	case opDeleteRS:
		return fmt.Sprintf("ipvsadm -d %s -r %s", virtualServer(o.vs), o.rs)
	case opBindAddr:
		return "ip addr add " + netip.PrefixFrom(o.addr, o.addr.BitLen()).String() + " dev " + dummyDevice
	case opUnbindAddr:
		return "ip addr del " + netip.PrefixFrom(o.addr, o.addr.BitLen()).String() + " dev " + dummyDevice
	case opAddEntry:
		return "ipset add " + set() + " " + o.entry.String()
	case opDelEntry:
		return "ipset del " + set() + " " + o.entry.String()
	}
	return "# " + o.String()
}

// ipsetCreate is the ipset command creating a set as the backend does: hash sets of the
// family, bitmap:port over every port.
func ipsetCreate(name string, t ipsetType, family model.IPFamily) string {
	if t == typeBitmapPort {
		return "ipset create " + name + " " + string(t) + " range 0-65535"
	}
	fam := "inet"
	if family == model.IPv6 {
		fam = "inet6"
	}
	return "ipset create " + name + " " + string(t) + " family " + fam
}

// virtualServer is ipvsadm's service address: -t, -u or --sctp-service, then address:port.
func virtualServer(k vsKey) string {
	flag := "-t"
	switch k.Proto {
	case model.UDP:
		flag = "-u"
	case model.SCTP:
		flag = "--sctp-service"
	}
	return flag + " " + netip.AddrPortFrom(k.Addr, k.Port).String()
}

// serviceOptions are ipvsadm's scheduler, persistence and scheduler flags.
func serviceOptions(p vsParams) string {
	s := "-s " + p.Scheduler
	if p.Flags&flagPersistent != 0 {
		s += " -p " + strconv.FormatUint(uint64(p.Timeout), 10)
	}
	var flags []string
	for _, f := range []struct {
		bit  uint32
		name string
	}{{0x0008, "flag-1"}, {flagSched2, "flag-2"}, {0x0020, "flag-3"}} {
		if p.Flags&f.bit == 0 {
			continue
		}
		name := f.name
		if f.bit == flagSched2 && (p.Scheduler == "mh" || p.Scheduler == "sh") {
			name = p.Scheduler + "-port" // ipvsadm's name for the same bit
		}
		flags = append(flags, name)
	}
	if len(flags) > 0 {
		s += " -b " + strings.Join(flags, ",")
	}
	return s
}
