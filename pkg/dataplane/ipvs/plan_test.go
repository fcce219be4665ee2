package ipvs

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestPlanVSConvergesRealServers(t *testing.T) {
	key := vsKey{model.TCP, addr("172.30.0.10"), 80}
	udpKey := vsKey{model.UDP, addr("172.30.0.53"), 53}
	a, b := addrPort("10.180.1.2:8080"), addrPort("10.180.2.3:8080")
	rr := vsParams{Scheduler: "rr"}
	tests := []struct {
		name     string
		desired  desiredVS
		kernel   *vsParams // nil: the virtual server is missing
		dests    []realServer
		want     []string
		draining bool
	}{{
		name:    "missing virtual server is added with its real servers",
		desired: desiredVS{key: key, params: rr, realServers: []netip.AddrPort{a, b}},
		want: []string{"add-vs 172.30.0.10:80/TCP rr", "add-rs 172.30.0.10:80/TCP 10.180.1.2:8080 weight 1",
			"add-rs 172.30.0.10:80/TCP 10.180.2.3:8080 weight 1"},
	}, {
		name:    "nothing to do",
		desired: desiredVS{key: key, params: rr, realServers: []netip.AddrPort{a}},
		kernel:  &rr, dests: []realServer{{Addr: a, Weight: 1, Active: 5}},
	}, {
		name:    "changed scheduler is updated in place",
		desired: desiredVS{key: key, params: vsParams{Scheduler: "mh", Flags: flagSched2}, realServers: []netip.AddrPort{a}},
		kernel:  &rr, dests: []realServer{{Addr: a, Weight: 1}},
		want: []string{"update-vs 172.30.0.10:80/TCP mh flags 0x10"},
	}, {
		name:    "removed TCP real server with connections drains at weight 0",
		desired: desiredVS{key: key, params: rr, realServers: []netip.AddrPort{a}},
		kernel:  &rr, dests: []realServer{{Addr: a, Weight: 1}, {Addr: b, Weight: 1, Inactive: 1}},
		want:     []string{"update-rs 172.30.0.10:80/TCP 10.180.2.3:8080 weight 0"},
		draining: true,
	}, {
		name:    "draining real server with connections is left alone",
		desired: desiredVS{key: key, params: rr, realServers: []netip.AddrPort{a}},
		kernel:  &rr, dests: []realServer{{Addr: a, Weight: 1}, {Addr: b, Weight: 0, Active: 1}},
		draining: true,
	}, {
		name:    "removed TCP real server without connections goes at once",
		desired: desiredVS{key: key, params: rr, realServers: []netip.AddrPort{a}},
		kernel:  &rr, dests: []realServer{{Addr: a, Weight: 1}, {Addr: b, Weight: 0}},
		want: []string{"delete-rs 172.30.0.10:80/TCP 10.180.2.3:8080"},
	}, {
		name:    "removed UDP real server goes at once, connections or not",
		desired: desiredVS{key: udpKey, params: rr, udpLike: true},
		kernel:  &rr, dests: []realServer{{Addr: b, Weight: 1, Inactive: 3}},
		want: []string{"delete-rs 172.30.0.53:53/UDP 10.180.2.3:8080"},
	}, {
		name:    "returning endpoint gets its weight back",
		desired: desiredVS{key: key, params: rr, realServers: []netip.AddrPort{a, b}},
		kernel:  &rr, dests: []realServer{{Addr: a, Weight: 1}, {Addr: b, Weight: 0, Active: 2}},
		want: []string{"update-rs 172.30.0.10:80/TCP 10.180.2.3:8080 weight 1"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := newKernelView()
			if tc.kernel != nil {
				k.services[tc.desired.key] = *tc.kernel
				k.dests[tc.desired.key] = tc.dests
			}
			draining := map[vsKey]types.NamespacedName{}
			ops, err := planVS(nn("ns/a"), &tc.desired, k, draining)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range ops {
				got = append(got, o.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ops (-want +got):\n%s", diff)
			}
			if _, ok := draining[tc.desired.key]; ok != tc.draining {
				t.Errorf("draining = %v, want %v", ok, tc.draining)
			}
		})
	}
}

func TestPlanVSNeedsTheRealServersRead(t *testing.T) {
	k := newKernelView()
	key := vsKey{model.TCP, addr("172.30.0.10"), 80}
	k.services[key] = vsParams{Scheduler: "rr"}
	if _, err := planVS(nn("ns/a"), &desiredVS{key: key, params: vsParams{Scheduler: "rr"}}, k, map[vsKey]types.NamespacedName{}); err == nil {
		t.Errorf("planned a virtual server whose real servers were not read")
	}
}
