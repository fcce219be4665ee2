package xtables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestChainOwnershipIsByModeAndTable(t *testing.T) {
	tests := []struct {
		table, chain   string
		iptables, ipvs bool
	}{
		{TableNAT, "KUBE-SERVICES", true, true},
		{TableFilter, "KUBE-SERVICES", true, false},
		{TableNAT, "KUBE-SVC-ABCDEFGHIJKLMNOP", true, false},
		{TableNAT, "KUBE-XLB-ABCDEFGHIJKLMNOP", true, false},
		{TableFilter, "KUBE-SVC-ABCDEFGHIJKLMNOP", false, false},
		{TableMangle, "KUBE-PROXY-CANARY", true, false},
		{TableMangle, "SLUICE-SERVICE-PACKETS", true, false},
		{TableMangle, "SLUICE-PKTE-ABCDEFGHIJKLMNOP", true, false},
		{TableNAT, "SLUICE-SERVICE-PACKETS", false, false},
		{TableNAT, "SLUICE-NEWC-ABCDEFGHIJKLMNOP", true, false},
		{TableMangle, "SLUICE-NEWE-ABCDEFGHIJKLMNOP", false, false},
		{TableFilter, "SLUICE-PKTC-ABCDEFGHIJKLMNOP", false, false},
		{TableFilter, "KUBE-NODE-PORT", false, true},
		{TableNAT, "KUBE-LOAD-BALANCER", false, true},
		{TableFilter, "KUBE-IPVS-OUT-FILTER", false, true},
		{TableNAT, "KUBE-MARK-MASQ", true, true},
		// kubelet's
		{TableFilter, "KUBE-FIREWALL", false, false},
		{TableNAT, "KUBE-MARK-DROP", false, false},
		{TableMangle, "KUBE-KUBELET-CANARY", false, false},
		{TableMangle, "KUBE-IPTABLES-HINT", false, false},
		// someone else's
		{TableNAT, "CNI-HOSTPORT-DNAT", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.table+"/"+tc.chain, func(t *testing.T) {
			if got := IPTablesModeChain(tc.table, tc.chain); got != tc.iptables {
				t.Errorf("IPTablesModeChain = %v", got)
			}
			if got := IPVSModeChain(tc.table, tc.chain); got != tc.ipvs {
				t.Errorf("IPVSModeChain = %v", got)
			}
			if got := KubeProxyChain(tc.table, tc.chain); got != (tc.iptables || tc.ipvs) {
				t.Errorf("KubeProxyChain = %v", got)
			}
		})
	}
}

// recordingRunner answers Save with fixed text and records what is restored.
type recordingRunner struct {
	saved    string
	restores []string
	fail     error
}

func (r *recordingRunner) Save(context.Context, ...string) ([]byte, error) {
	return []byte(r.saved), nil
}
func (r *recordingRunner) Restore(_ context.Context, in []byte) error {
	r.restores = append(r.restores, string(in))
	return r.fail
}

const savedBoth = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-NODE-PORT - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -m conntrack --ctstate NEW -j KUBE-PROXY-FIREWALL
-A INPUT -j KUBE-NODE-PORT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-ABCDEF - [0:0]
:KUBE-SEP-123456 - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:CNI-FOO - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -j CNI-FOO
-A CNI-FOO -d 10.0.0.0/8 -g KUBE-MARK-MASQ
-A KUBE-SERVICES -d 172.30.0.1/32 -j KUBE-SVC-ABCDEF
-A KUBE-SVC-ABCDEF -j KUBE-SEP-123456
COMMIT
`

func TestRemoveChainsUnlinksFlushesThenDeletesInBatches(t *testing.T) {
	tests := []struct {
		name  string
		owned func(table, chain string) bool
		max   int
		want  []string
		n     int
	}{
		{
			name:  "every kube-proxy chain; one another program jumps to is emptied, not deleted",
			owned: KubeProxyChain,
			want: []string{`*filter
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-NODE-PORT - [0:0]
-D INPUT -m conntrack --ctstate NEW -j KUBE-PROXY-FIREWALL
-D INPUT -j KUBE-NODE-PORT
COMMIT
*nat
:KUBE-SVC-ABCDEF - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SEP-123456 - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
`, `*filter
-X KUBE-NODE-PORT
-X KUBE-PROXY-FIREWALL
COMMIT
*nat
-X KUBE-POSTROUTING
-X KUBE-SEP-123456
-X KUBE-SERVICES
-X KUBE-SVC-ABCDEF
COMMIT
`},
			n: 6,
		},
		{
			name:  "the ipvs mode's chains only, two per restore",
			owned: func(table, chain string) bool { return IPVSModeChain(table, chain) && !IPTablesModeChain(table, chain) },
			max:   2,
			want: []string{`*filter
:KUBE-NODE-PORT - [0:0]
-D INPUT -j KUBE-NODE-PORT
COMMIT
`, `*filter
-X KUBE-NODE-PORT
COMMIT
`},
			n: 1,
		},
		{
			name:  "nothing owned",
			owned: func(string, string) bool { return false },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &recordingRunner{saved: savedBoth}
			n, err := RemoveChains(context.Background(), r, tc.owned, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.n {
				t.Errorf("removed %d chains, want %d", n, tc.n)
			}
			if diff := cmp.Diff(tc.want, r.restores); diff != "" {
				t.Errorf("restores (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRemoveChainsBatchesDeletesAcrossTables(t *testing.T) {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range []string{"KUBE-SEP-A", "KUBE-SEP-B", "KUBE-SEP-C"} {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	b.WriteString("COMMIT\n*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n")
	r := &recordingRunner{saved: b.String()}
	n, err := RemoveChains(context.Background(), r, KubeProxyChain, 3)
	if err != nil || n != 4 {
		t.Fatalf("removed %d, %v", n, err)
	}
	want := []string{
		"*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*nat\n:KUBE-SEP-C - [0:0]\n:KUBE-SEP-B - [0:0]\n:KUBE-SEP-A - [0:0]\nCOMMIT\n",
		"*mangle\n-X KUBE-PROXY-CANARY\nCOMMIT\n*nat\n-X KUBE-SEP-A\n-X KUBE-SEP-B\nCOMMIT\n",
		"*nat\n-X KUBE-SEP-C\nCOMMIT\n",
	}
	if diff := cmp.Diff(want, r.restores); diff != "" {
		t.Errorf("restores (-want +got):\n%s", diff)
	}
}

func TestRemoveChainsReportsARefusedRestore(t *testing.T) {
	r := &recordingRunner{saved: savedBoth, fail: errors.New("refused")}
	if n, err := RemoveChains(context.Background(), r, KubeProxyChain, 0); err == nil || n != 0 {
		t.Errorf("removed %d, err %v; want nothing removed and the error", n, err)
	}
}

// TestRemoveChainsTakesThePacketCountersOutOfMangle: sluice's packet counters (the
// iptables mode's, in mangle) go with their jumps; kubelet's chains in mangle stay.
func TestRemoveChainsTakesThePacketCountersOutOfMangle(t *testing.T) {
	r := &recordingRunner{saved: `*mangle
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:SLUICE-PKTC-ABCDEF - [0:0]
:SLUICE-SERVICE-PACKETS - [0:0]
-A PREROUTING ! -i lo -m conntrack --ctdir ORIGINAL -m comment --comment "sluice service packet counters" -j SLUICE-SERVICE-PACKETS
-A OUTPUT -m conntrack --ctdir ORIGINAL -m comment --comment "sluice service packet counters" -j SLUICE-SERVICE-PACKETS
-A SLUICE-PKTC-ABCDEF -m comment --comment "ns/web:http traffic counter"
-A SLUICE-SERVICE-PACKETS -d 172.30.0.1/32 -p tcp -m tcp --dport 80 -g SLUICE-PKTC-ABCDEF
COMMIT
`}
	n, err := RemoveChains(context.Background(), r, KubeProxyChain, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`*mangle
:SLUICE-SERVICE-PACKETS - [0:0]
:SLUICE-PKTC-ABCDEF - [0:0]
:KUBE-PROXY-CANARY - [0:0]
-D PREROUTING ! -i lo -m conntrack --ctdir ORIGINAL -m comment --comment "sluice service packet counters" -j SLUICE-SERVICE-PACKETS
-D OUTPUT -m conntrack --ctdir ORIGINAL -m comment --comment "sluice service packet counters" -j SLUICE-SERVICE-PACKETS
COMMIT
`, `*mangle
-X KUBE-PROXY-CANARY
-X SLUICE-PKTC-ABCDEF
-X SLUICE-SERVICE-PACKETS
COMMIT
`}
	if n != 3 {
		t.Errorf("removed %d chains, want 3", n)
	}
	if diff := cmp.Diff(want, r.restores); diff != "" {
		t.Errorf("restores (-want +got):\n%s", diff)
	}
}
