// Package xtables is what the iptables-based parts of sluice share: the iptables mode's
// backend, the rules the ipvs mode writes around IPVS, and the removal of other modes'
// leftovers (package leftovers).
//
//   - flavour.go: which iptables a node uses, legacy or nft, decided by one rule.
//   - tools.go: the save and restore programs of one flavour and family, behind a seam that
//     unit tests script.
//   - save.go: iptables-save output, parsed.
//   - chains.go: which chains belong to kube-proxy's iptables and ipvs modes (and so to
//     sluice), and their removal with the rules that jump to them.
//   - nft.go: reading iptables-nft's tables over netlink, which is fast where
//     iptables-nft-save is slow.
//
// It knows nothing of Services: what a backend writes is the backend's.
package xtables
