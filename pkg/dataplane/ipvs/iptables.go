package ipvs

import "github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"

// Flavour is an iptables implementation: "legacy" (x_tables) or "nft" (iptables-nft, which
// writes nf_tables rules emulating x_tables). Unless configured, New uses the one the node
// uses (xtables.Choose: kubelet's hint chain, then the flavour holding more chains, then
// the one installed as `iptables`).
type Flavour = xtables.Flavour

// The two flavours.
const (
	FlavourLegacy = xtables.Legacy
	FlavourNFT    = xtables.NFT
)
