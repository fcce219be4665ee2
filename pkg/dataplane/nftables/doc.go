// Package nftables is the nftables backend (mode: nftables): it programs the kube-proxy
// table of one IP family over netlink, laid out like upstream kube-proxy's so that a node
// can switch between the two by converging one table.
//
// A pure planner (plan.go) turns the desired model.NodeState and the backend's model of
// the kernel table into groups of operations, one group per Service; an applier
// (apply.go, encode.go, netlink.go) sends them as batched netlink transactions and leaves
// out the groups the kernel rejects. Partial syncs touch only the Services that changed;
// a full sync reads the table back and repairs drift. README.md explains the layout and
// the design, with every difference from upstream and its reason.
package nftables
