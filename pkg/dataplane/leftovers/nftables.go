package leftovers

import (
	"fmt"

	"github.com/google/nftables"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// NFTablesTable is the table of kube-proxy's nftables mode (and sluice's) in the ip and ip6
// families.
const NFTablesTable = "kube-proxy"

// DeleteNFTablesTable deletes the nftables mode's table of one family (`ip kube-proxy` or
// `ip6 kube-proxy`) and reports whether there was one. A kernel without nf_tables has none.
func DeleteNFTablesTable(family model.IPFamily) (deleted bool, err error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("netlink connection for nf_tables: %w", err)
	}
	tf := nftables.TableFamilyIPv4
	if family == model.IPv6 {
		tf = nftables.TableFamilyIPv6
	}
	tables, err := c.ListTablesOfFamily(tf)
	if err != nil {
		if hostnet.IsNotSupported(err) {
			return false, nil
		}
		return false, fmt.Errorf("list nf_tables tables: %w", err)
	}
	found := false
	for _, t := range tables {
		if t.Name == NFTablesTable {
			c.DelTable(t)
			found = true
		}
	}
	if !found {
		return false, nil
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("delete nftables table %s: %w", NFTablesTable, err)
	}
	return true, nil
}
