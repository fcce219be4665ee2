package iptables

import "github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"

// Flavour is the iptables implementation: "legacy" (x_tables, the ip_tables kernel
// modules, one blob per table) or "nft" (the iptables-nft tools writing nf_tables rules
// that emulate x_tables). Unless configured, New picks the one the node uses
// (xtables.Choose: kubelet's hint chain, then the flavour holding more chains, then the
// one installed as `iptables`).
type Flavour = xtables.Flavour

// The two flavours.
const (
	FlavourLegacy = xtables.Legacy
	FlavourNFT    = xtables.NFT
)
