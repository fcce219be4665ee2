// Package leftovers removes what the other proxy modes, kube-proxy's or sluice's, left in
// the kernel of this network namespace, for a node that switched modes: the nftables
// mode's table, the ipvs mode's virtual servers, kube-ipvs0 device and ipsets, and the
// iptables and ipvs modes' chains in both iptables flavours.
//
// RemoveOtherModes is the one place that decides what each mode removes and when; every
// backend calls it once, after its first successful sync, so that the node is never
// without rules. The per-mode differences, and their reasons, are written next to it.
// Chains are found and removed with package xtables.
//
// Everything here acts on the network namespace of the calling thread and needs
// CAP_NET_ADMIN; the decisions (which sets, which chains in which flavour) are tested
// without.
package leftovers
