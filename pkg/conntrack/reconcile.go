package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Tuple is one direction of a conntrack entry.
type Tuple struct {
	Src, Dst netip.AddrPort
}

// Flow is one conntrack entry: the tuple the first packet had (Orig) and the tuple
// replies are expected with (Reply). After DNAT, Reply.Src is the endpoint.
type Flow struct {
	Protocol    uint8
	Orig, Reply Tuple
}

// flowTable is the kernel's conntrack table. A seam for tests.
type flowTable interface {
	// Walk calls visit for every entry of one family and protocol and deletes those for
	// which it returns true. Memory stays bounded: entries are streamed, not collected.
	Walk(ctx context.Context, family model.IPFamily, protocol uint8, visit func(*Flow) bool) (deleted int, err error)
}

// protocols the reconciler looks after. TCP is left alone: its endpoints reset or time
// out, and deleting TCP entries would break connections that are draining on purpose.
var protocolNumbers = map[model.Protocol]uint8{model.UDP: unix.IPPROTO_UDP, model.SCTP: unix.IPPROTO_SCTP}

// frontend is an address clients send a Service's traffic to.
type frontend struct {
	protocol uint8
	addr     netip.AddrPort
}

// nodePort is a NodePort, reachable on every local address.
type nodePort struct {
	protocol uint8
	port     uint16
}

// plan says which entries are stale: those sent to a frontend of a changed Service whose
// replies do not come from one of that Service's serving endpoints.
type plan struct {
	frontends map[frontend]map[netip.AddrPort]bool
	nodePorts map[nodePort]map[netip.AddrPort]bool
	local     map[netip.Addr]bool
	protocols map[uint8]bool
}

// newPlan builds the plan for the changed Services of desired (every Service when
// changes.Full). A Service with no serving endpoint left gets an empty allowed set, so
// every entry to it is stale: a Service scaled to zero is cleaned up too (upstream skipped
// it in 1.32–1.36, https://issues.k8s.io/139628). A Service scaling up from zero is
// covered by the same rule: entries created while it had no endpoint were not DNATed, so
// their replies come from the frontend itself, which is never a serving endpoint.
//
// NodePort entries are matched on the destination port and, unlike upstream, also on the
// destination being one of this node's addresses: that keeps flows to other hosts on the
// same port number safe, so NodePorts of Services without endpoints are cleaned up too.
//
// Deleted Services are not in desired and are skipped: nothing routes to their frontends
// any more, and a new Service reusing the address is a changed Service of its own.
func newPlan(desired *model.NodeState, changes model.Changes, localAddrs []netip.Addr) *plan {
	p := &plan{
		frontends: map[frontend]map[netip.AddrPort]bool{},
		nodePorts: map[nodePort]map[netip.AddrPort]bool{},
		local:     map[netip.Addr]bool{},
		protocols: map[uint8]bool{},
	}
	for _, a := range localAddrs {
		p.local[a.Unmap()] = true
	}
	for name, sp := range desired.Services {
		proto, ok := protocolNumbers[name.Protocol]
		if !ok {
			continue
		}
		if !changes.Full && !changes.Services.Has(name.NamespacedName) {
			continue
		}
		// Traffic policy, topology and terminating state do not matter: an established
		// flow to any endpoint that still serves may go on, as it does for TCP.
		allowed := map[netip.AddrPort]bool{}
		for _, ep := range sp.AllEndpoints {
			if ep.Serving {
				allowed[ep.AddrPort()] = true
			}
		}
		port := uint16(sp.Port)
		p.frontends[frontend{proto, netip.AddrPortFrom(sp.ClusterIP, port)}] = allowed
		for _, ip := range sp.ExternalIPs {
			p.frontends[frontend{proto, netip.AddrPortFrom(ip, port)}] = allowed
		}
		for _, ip := range sp.LoadBalancerVIPs {
			p.frontends[frontend{proto, netip.AddrPortFrom(ip, port)}] = allowed
		}
		if sp.NodePort != 0 {
			p.nodePorts[nodePort{proto, uint16(sp.NodePort)}] = allowed
		}
		p.protocols[proto] = true
	}
	return p
}

func (p *plan) empty() bool { return len(p.protocols) == 0 }

// stale reports whether f must be deleted.
func (p *plan) stale(f *Flow) bool {
	dst := netip.AddrPortFrom(f.Orig.Dst.Addr().Unmap(), f.Orig.Dst.Port())
	reply := netip.AddrPortFrom(f.Reply.Src.Addr().Unmap(), f.Reply.Src.Port())
	if allowed, ok := p.frontends[frontend{f.Protocol, dst}]; ok {
		return !allowed[reply]
	}
	if allowed, ok := p.nodePorts[nodePort{f.Protocol, dst.Port()}]; ok && p.local[dst.Addr()] {
		return !allowed[reply]
	}
	return false
}

// Reconciler deletes the conntrack entries that would keep UDP or SCTP traffic of a
// changed Service going where it should not: to an endpoint that no longer serves, or
// nowhere (sent while the Service had none). It serves one IP family; it is backend-neutral
// (its input is the model) and is meant to run after each successful sync.
type Reconciler struct {
	family     model.IPFamily
	table      flowTable
	localAddrs func() ([]netip.Addr, error)
}

// ReconcilerOption changes how NewReconciler builds a Reconciler.
type ReconcilerOption func(*Reconciler)

// WithLocalAddresses replaces the lookup of this node's addresses (NodePort destinations).
func WithLocalAddresses(fn func() ([]netip.Addr, error)) ReconcilerOption {
	return func(r *Reconciler) { r.localAddrs = fn }
}

func withFlowTable(t flowTable) ReconcilerOption { return func(r *Reconciler) { r.table = t } }

// NewReconciler returns the Reconciler of one family, talking to the kernel over netlink.
func NewReconciler(family model.IPFamily, opts ...ReconcilerOption) *Reconciler {
	r := &Reconciler{family: family, table: netlinkTable{}, localAddrs: hostnet.InterfaceAddrs}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Reconcile deletes stale entries of the changed Services (all Services when
// changes.Full) and returns how many it deleted. It does nothing, and reads nothing from
// the kernel, when no changed Service has a UDP or SCTP port.
func (r *Reconciler) Reconcile(ctx context.Context, desired *model.NodeState, changes model.Changes) (int, error) {
	start := time.Now()
	logger := klog.FromContext(ctx)
	var local []netip.Addr
	if addrs, err := r.localAddrs(); err != nil {
		logger.Error(err, "Could not list local addresses; NodePort entries are left alone")
	} else {
		local = addrs
	}
	p := newPlan(desired, changes, local)
	if p.empty() {
		return 0, nil
	}
	fam := r.family.String()
	total := 0
	var firstErr error
	for _, proto := range []uint8{unix.IPPROTO_UDP, unix.IPPROTO_SCTP} {
		if !p.protocols[proto] {
			continue
		}
		n, err := r.table.Walk(ctx, r.family, proto, func(f *Flow) bool {
			if !p.stale(f) {
				return false
			}
			logger.V(6).Info("Deleting conntrack entry", "protocol", f.Protocol, "origDst", f.Orig.Dst, "replySrc", f.Reply.Src)
			return true
		})
		total += n
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("reconciling conntrack entries (protocol %d): %w", proto, err)
		}
	}
	metrics.ReconcileConntrackFlowsLatency.WithLabelValues(fam).Observe(time.Since(start).Seconds())
	metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(fam).Add(float64(total))
	logger.V(4).Info("Reconciled conntrack entries", "ipFamily", fam, "deleted", total, "elapsed", time.Since(start).Seconds())
	return total, firstErr
}
