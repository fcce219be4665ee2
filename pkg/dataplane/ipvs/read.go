package ipvs

// The kernel read of a sync: everything for a full sync, the real servers of the
// Services in scope for a partial one.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// readKernel reads everything a full sync converges: virtual servers with their real
// servers, the dummy device's addresses, the node's addresses and the ipsets.
func (b *Backend) readKernel(ctx context.Context, desired *model.NodeState) error {
	v := newKernelView()
	all, err := b.ipvs.Services()
	if err != nil {
		return fmt.Errorf("read IPVS services: %w", err)
	}
	for k, p := range all {
		if model.FamilyOf(k.Addr) == b.cfg.Family {
			v.services[k] = p
		}
	}
	for k := range v.services {
		if err := ctx.Err(); err != nil {
			return err
		}
		dests, err := b.ipvs.Destinations(k)
		if err != nil {
			if errors.Is(err, errNotExist) {
				delete(v.services, k)
				continue
			}
			return fmt.Errorf("read IPVS real servers: %w", err)
		}
		v.dests[k] = dests
		b.stats.DestinationReads++
	}

	exists, addrs, err := b.links.Dummy(dummyDevice)
	if err != nil {
		return err
	}
	v.linkExists = exists
	for _, a := range addrs {
		if model.FamilyOf(a) == b.cfg.Family && !a.IsLinkLocalUnicast() {
			v.bound[a] = true
		}
	}

	for id := ipsetID(0); id < numIPSets; id++ {
		ks, err := b.sets.List(ipsetName(id, b.cfg.Family))
		if err != nil {
			if errors.Is(err, errNotExist) {
				continue
			}
			return fmt.Errorf("read ipsets: %w", err)
		}
		v.sets[id] = ks
	}

	local, err := b.links.Addrs()
	if err != nil {
		return fmt.Errorf("read node addresses: %w", err)
	}
	b.env = b.makeEnv(local, desired)
	b.view = v
	b.draining = map[vsKey]types.NamespacedName{}
	return nil
}

// makeEnv derives the addresses Services depend on from the node's addresses.
func (b *Backend) makeEnv(local []linkAddr, desired *model.NodeState) *planEnv {
	env := &planEnv{family: b.cfg.Family, scheduler: b.settings.Scheduler, localAddrs: map[netip.Addr]bool{}}
	if ips := desired.Node.IPsOf(b.cfg.Family); len(ips) > 0 {
		env.nodeIP = ips[0]
	}
	np := map[netip.Addr]bool{}
	for _, la := range local {
		if la.link == dummyDevice || model.FamilyOf(la.addr) != b.cfg.Family {
			continue
		}
		env.localAddrs[la.addr] = true
		if la.addr.IsLoopback() || la.addr.IsLinkLocalUnicast() {
			continue
		}
		if !b.cfg.NodePortAddresses.MatchAll {
			match := false
			for _, c := range b.cfg.NodePortAddresses.CIDRs {
				if c.Contains(la.addr) {
					match = true
				}
			}
			if !match {
				continue
			}
		}
		np[la.addr] = true
	}
	env.nodePortIPs = sortedAddrs(np)
	return env
}

// readDestinations reads the real servers of every virtual server that the Services in
// scope want or hold, for a partial sync.
func (b *Backend) readDestinations(scope sets.Set[types.NamespacedName], records map[types.NamespacedName]*serviceRecord) error {
	want := map[vsKey]bool{}
	for name := range scope {
		for _, d := range records[name].vssOrNil() {
			want[d.key] = true
		}
		for k := range b.idx.ownedBy[name] {
			want[k] = true
		}
	}
	b.view.dests = map[vsKey][]realServer{}
	for k := range want {
		if _, ok := b.view.services[k]; !ok {
			continue
		}
		dests, err := b.ipvs.Destinations(k)
		if err != nil {
			if errors.Is(err, errNotExist) {
				// Deleted behind sluice's back: the plan adds it again.
				delete(b.view.services, k)
				continue
			}
			return fmt.Errorf("read IPVS real servers: %w", err)
		}
		b.view.dests[k] = dests
		b.stats.DestinationReads++
	}
	return nil
}
