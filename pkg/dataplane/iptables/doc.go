// Package iptables is sluice's iptables backend: it programs Services for one IP family
// with the same chains, rules and comments as upstream kube-proxy's iptables mode, so that
// a node can switch between the two in either direction with no leftover rule and no gap
// in traffic.
//
// The rules come from a pure generator (render.go, plan.go) that turns the model into
// iptables-restore text; apply.go feeds it to iptables-restore --noflush (partial and
// full syncs, blaming a refused Service) and uses go-iptables for the few rules in
// built-in chains; read.go reads the kernel back before a full sync; backend.go holds
// the Backend and the decision between a partial and a full sync.
// Partial syncs rewrite only what changed, a Service whose rules the kernel refuses is left
// out without holding the others back, and both iptables flavours (legacy and nft) are
// supported, including rulesets iptables-nft cannot load in one piece. README.md explains
// the layout and the theory.
package iptables
