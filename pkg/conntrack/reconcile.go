package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
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
	// Replied is set once a packet went the reply way (IPS_SEEN_REPLY).
	Replied bool
}

// flowTable is the kernel's conntrack table. A seam for tests.
type flowTable interface {
	// Walk calls visit for every entry of one family and protocol and deletes those for
	// which it returns true. Memory stays bounded: entries are streamed, not collected.
	Walk(ctx context.Context, family model.IPFamily, protocol uint8, visit func(*Flow) bool) (deleted int, err error)
}

// protocols whose stale entries the plan looks after. TCP is left to its endpoints (they
// reset or time out; deleting answered TCP entries would break connections that are
// draining on purpose), except for connection attempts that beat a new frontend's rules
// (unansweredTCP).
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

// frontendAddrs lists the addresses clients reach sp on (NodePorts aside).
func frontendAddrs(sp *model.ServicePort) []netip.AddrPort {
	port := uint16(sp.Port)
	out := []netip.AddrPort{netip.AddrPortFrom(sp.ClusterIP, port)}
	for _, ip := range sp.ExternalIPs {
		out = append(out, netip.AddrPortFrom(ip, port))
	}
	for _, ip := range sp.LoadBalancerVIPs {
		out = append(out, netip.AddrPortFrom(ip, port))
	}
	return out
}

// unansweredTCP reports whether f is a TCP connection attempt to one of frontends that was
// never DNATed and never answered: its SYN came before the rules for that frontend
// existed, so it was routed as it was, nowhere. Such an entry outlives the rules' arrival
// (conntrack keeps SYN_SENT for 120 s), and every packet of its 4-tuple keeps matching it,
// un-NATed: the client's SYN retransmissions, and a new connection that reuses the source
// port. Deleting it lets the next SYN be a new connection that the rules now DNAT.
// Nothing is lost: no packet of it was ever answered.
func unansweredTCP(f *Flow, frontends map[netip.AddrPort]bool) bool {
	dst := netip.AddrPortFrom(f.Orig.Dst.Addr().Unmap(), f.Orig.Dst.Port())
	replySrc := netip.AddrPortFrom(f.Reply.Src.Addr().Unmap(), f.Reply.Src.Port())
	return !f.Replied && replySrc == dst && frontends[dst]
}

// Reconciler deletes the conntrack entries that would keep traffic of a changed Service
// going where it should not: for UDP and SCTP, to an endpoint that no longer serves, or
// nowhere (sent while the Service had none); for TCP, only connection attempts that
// reached a new frontend before its rules did (unansweredTCP), which upstream leaves to
// hang until conntrack forgets them. It serves one IP family; it is backend-neutral (its
// input is the model) and is meant to run after each successful sync.
type Reconciler struct {
	family     model.IPFamily
	table      flowTable
	localAddrs func() ([]netip.Addr, error)
	// tcpFrontends are the TCP frontends of each Service as of the last reconcile. Only
	// a frontend missing from it can have unanswered entries: walking the TCP table,
	// which is usually the big one, is for syncs that program new frontends, not for
	// every endpoint change.
	tcpFrontends map[types.NamespacedName][]netip.AddrPort
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

// newTCPFrontends returns the TCP frontends of the changed Services (all Services when
// changes.Full) that the last reconcile did not know, and records the current ones.
func (r *Reconciler) newTCPFrontends(desired *model.NodeState, changes model.Changes) map[netip.AddrPort]bool {
	if r.tcpFrontends == nil {
		r.tcpFrontends = map[types.NamespacedName][]netip.AddrPort{}
	}
	names := changes.Services
	if changes.Full {
		names = desired.ServiceNames()
		for name := range r.tcpFrontends {
			if !names.Has(name) {
				delete(r.tcpFrontends, name)
			}
		}
	}
	fresh := map[netip.AddrPort]bool{}
	for name := range names {
		var current []netip.AddrPort
		for _, sp := range desired.PortsOf(name) {
			if sp.Name.Protocol == model.TCP {
				current = append(current, frontendAddrs(sp)...)
			}
		}
		known := map[netip.AddrPort]bool{}
		for _, a := range r.tcpFrontends[name] {
			known[a] = true
		}
		for _, a := range current {
			if !known[a] {
				fresh[a] = true
			}
		}
		if len(current) == 0 {
			delete(r.tcpFrontends, name)
		} else {
			r.tcpFrontends[name] = current
		}
	}
	return fresh
}

// Reconcile deletes stale entries of the changed Services (all Services when
// changes.Full) and returns how many it deleted. It does nothing, and reads nothing from
// the kernel, when no changed Service has a UDP or SCTP port or a new TCP frontend.
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
	freshTCP := r.newTCPFrontends(desired, changes)
	if p.empty() && len(freshTCP) == 0 {
		return 0, nil
	}
	fam := r.family.String()
	total := 0
	var firstErr error
	if len(freshTCP) > 0 {
		n, err := r.table.Walk(ctx, r.family, unix.IPPROTO_TCP, func(f *Flow) bool {
			if !unansweredTCP(f, freshTCP) {
				return false
			}
			logger.V(4).Info("Deleting an unanswered TCP conntrack entry that predates its Service's rules", "origSrc", f.Orig.Src, "origDst", f.Orig.Dst)
			return true
		})
		total += n
		if err != nil {
			firstErr = fmt.Errorf("reconciling conntrack entries (protocol %d): %w", unix.IPPROTO_TCP, err)
		}
	}
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

// DeleteUnansweredTCP deletes, in this network namespace, the TCP entries to frontends
// that were never DNATed and never answered (see unansweredTCP), and returns how many.
// The Reconciler does this for the frontends a sync programs; it is exported for tests
// that must clear such entries left by another proxy, which keeps them.
func DeleteUnansweredTCP(ctx context.Context, family model.IPFamily, frontends []netip.AddrPort) (int, error) {
	set := map[netip.AddrPort]bool{}
	for _, f := range frontends {
		set[netip.AddrPortFrom(f.Addr().Unmap(), f.Port())] = true
	}
	return netlinkTable{}.Walk(ctx, family, unix.IPPROTO_TCP, func(f *Flow) bool { return unansweredTCP(f, set) })
}
