// Package leftovers removes what another proxy mode, kube-proxy's or sluice's, left in the
// kernel of this network namespace, for a node that switched modes: the nftables mode's
// table, the ipvs mode's virtual servers and kube-ipvs0 device, and the ipvs mode's ipsets.
//
// It knows how to find and remove each of these; each backend decides which it removes and
// when (after its first successful sync, so that the node is never without rules). The
// iptables rules of the other modes are not here: each backend removes them with its own
// iptables-restore plumbing.
//
// Everything here acts on the network namespace of the calling thread and needs
// CAP_NET_ADMIN; the pure parts (ipset names, which sets to destroy) are tested without.
package leftovers
