package iptables

import (
	"context"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestApplySysctlsSetsRouteLocalnetOnlyForLocalhostNodePorts(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*dataplane.Config)
		want int
	}{
		{"localhost NodePorts", func(*dataplane.Config) {}, 1},
		{"option off", func(c *dataplane.Config) { c.LocalhostNodePorts = false }, 0},
		{"nodePortAddresses without loopback", func(c *dataplane.Config) {
			c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netipPrefix{mustPrefix("192.168.0.0/16")}}
		}, 0},
		{"IPv6", func(c *dataplane.Config) { c.Family = model.IPv6 }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(model.IPv4)
			tc.cfg(&cfg)
			sys := fakeSysctl{sysctlRouteLocalnet: 0}
			if err := ApplySysctls(context.Background(), cfg, WithSysctls(sys)); err != nil {
				t.Fatal(err)
			}
			if got := sys[sysctlRouteLocalnet]; got != tc.want {
				t.Errorf("route_localnet = %d, want %d", got, tc.want)
			}
		})
	}
}
