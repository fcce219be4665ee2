package xtables

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/hostnet/nlattr"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// ListNFTChains lists the chains of an iptables-nft table over netlink: one dump of the
// table's chains, reading only their names. (google/nftables' ListChains decodes every
// chain of every table in full: 6.5 s for 110 000 chains; this takes a fraction of that.)
// A table that does not exist has no chains.
func ListNFTChains(family model.IPFamily, table string) (map[string]bool, error) {
	fam := uint8(unix.NFPROTO_IPV4)
	if family == model.IPv6 {
		fam = unix.NFPROTO_IPV6
	}
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETCHAIN, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: fam, Version: nl.NFNETLINK_V0})
	// The kernel filters the dump by table; older kernels ignore the attribute, and the
	// table of each chain is checked here anyway.
	req.AddData(nl.NewRtAttr(unix.NFTA_CHAIN_TABLE, nl.ZeroTerminated(table)))
	out := map[string]bool{}
	err := req.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		if len(msg) < nl.SizeofNfgenmsg {
			return true
		}
		var name, tbl string
		nlattr.Walk(msg[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
			switch typ {
			case unix.NFTA_CHAIN_TABLE:
				tbl = nlattr.String(v)
			case unix.NFTA_CHAIN_NAME:
				name = nlattr.String(v)
			}
		})
		if tbl == table && name != "" {
			out[name] = true
		}
		return true
	})
	if errors.Is(err, unix.ENOENT) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing nf_tables chains of %s: %w", table, err)
	}
	return out, nil
}
