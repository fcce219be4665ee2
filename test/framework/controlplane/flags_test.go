package controlplane

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/test/errtest"
)

func TestNewConfigDefaultsAndValidation(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		wantBind  string
		wantCIDRs []string
		wantErr   string
	}{
		{name: "zero options are IPv4 on loopback", wantBind: "127.0.0.1", wantCIDRs: []string{"10.96.0.0/16"}},
		{name: "link-local bind address", opts: Options{BindAddress: "169.254.20.1"}, wantBind: "169.254.20.1", wantCIDRs: []string{"10.96.0.0/16"}},
		{name: "IPv4-mapped address is unmapped", opts: Options{BindAddress: "::ffff:127.0.0.1"}, wantBind: "127.0.0.1", wantCIDRs: []string{"10.96.0.0/16"}},
		{name: "dual-stack pair", opts: Options{ServiceCIDRs: DualStackServiceCIDRs()}, wantBind: "127.0.0.1", wantCIDRs: []string{"10.96.0.0/16", "fd00:10:96::/112"}},
		{name: "IPv6 first", opts: Options{BindAddress: "::1", ServiceCIDRs: []string{"fd00::/112", "10.0.0.0/24"}}, wantBind: "::1", wantCIDRs: []string{"fd00::/112", "10.0.0.0/24"}},
		{name: "wildcard bind address", opts: Options{BindAddress: "0.0.0.0"}, wantErr: "not a wildcard"},
		{name: "bind address not an IP", opts: Options{BindAddress: "localhost"}, wantErr: `bind address "localhost"`},
		{name: "two ranges of one family", opts: Options{ServiceCIDRs: []string{"10.96.0.0/16", "10.97.0.0/16"}}, wantErr: "one IPv4 and one IPv6"},
		{name: "three ranges", opts: Options{ServiceCIDRs: []string{"10.96.0.0/16", "fd00::/112", "10.97.0.0/16"}}, wantErr: "at most two"},
		{name: "host bits set", opts: Options{ServiceCIDRs: []string{"10.96.0.1/16"}}, wantErr: "did you mean 10.96.0.0/16"},
		{name: "extra flag without dashes", opts: Options{ExtraAPIServerFlags: []string{"v=4"}}, wantErr: `extra flag "v=4"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := newConfig(tt.opts)
			if errtest.Want(t, err, tt.wantErr) {
				return
			}
			if c.bindAddress.String() != tt.wantBind {
				t.Errorf("bind address = %s, want %s", c.bindAddress, tt.wantBind)
			}
			var cidrs []string
			for _, p := range c.serviceCIDRs {
				cidrs = append(cidrs, p.String())
			}
			if !slices.Equal(cidrs, tt.wantCIDRs) {
				t.Errorf("service CIDRs = %v, want %v", cidrs, tt.wantCIDRs)
			}
		})
	}
}

func TestEndpointReconcilerIsOffForAddressesEndpointsCannotHold(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1":    "none",
		"::1":          "none",
		"169.254.20.1": "none",
		"fe80::1":      "none",
		"10.0.0.1":     "lease",
		"192.168.1.10": "lease",
		"2001:db8::1":  "lease",
	} {
		if got := endpointReconcilerType(netip.MustParseAddr(addr)); got != want {
			t.Errorf("endpointReconcilerType(%s) = %s, want %s", addr, got, want)
		}
	}
}

func TestKubernetesServiceIPIsFirstAddressOfEachRange(t *testing.T) {
	got := kubernetesServiceIPs([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:10:96::/112")})
	want := []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:10:96::1")}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestServingCertSANsCoverEveryWayIn(t *testing.T) {
	c, err := newConfig(Options{BindAddress: "169.254.20.1", ServiceCIDRs: DualStackServiceCIDRs()})
	if err != nil {
		t.Fatal(err)
	}
	ips, names := servingCertSANs(c)
	var got []string
	for _, ip := range ips {
		got = append(got, ip.String())
	}
	want := []string{"127.0.0.1", "::1", "169.254.20.1", "10.96.0.1", "fd00:10:96::1"}
	if !slices.Equal(got, want) {
		t.Errorf("IP SANs = %v, want %v", got, want)
	}
	if !slices.Contains(names, "kubernetes.default.svc") || !slices.Contains(names, "localhost") {
		t.Errorf("DNS SANs = %v, want localhost and the kubernetes Service names", names)
	}

	// The default bind address is not listed twice.
	c, _ = newConfig(Options{})
	ips, _ = servingCertSANs(c)
	if len(ips) != 3 {
		t.Errorf("IP SANs for the defaults = %v, want 127.0.0.1, ::1, 10.96.0.1", ips)
	}
}

func TestAPIServerArgs(t *testing.T) {
	files := apiServerFiles{caCert: "/d/ca.crt", servingCert: "/d/s.crt", servingKey: "/d/s.key", serviceAccountKey: "/d/sa.key", serviceAccountPub: "/d/sa.pub", certDir: "/d/certs"}
	t.Run("framework flags", func(t *testing.T) {
		c, _ := newConfig(Options{BindAddress: "169.254.20.1", ServiceCIDRs: DualStackServiceCIDRs()})
		args := apiServerArgs(c, 6443, "http://127.0.0.1:2379", files)
		for _, want := range []string{
			"--bind-address=169.254.20.1",
			"--advertise-address=169.254.20.1",
			"--secure-port=6443",
			"--etcd-servers=http://127.0.0.1:2379",
			"--client-ca-file=/d/ca.crt",
			"--authorization-mode=Node,RBAC",
			"--service-account-signing-key-file=/d/sa.key",
			"--service-account-key-file=/d/sa.pub",
			"--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112",
			"--endpoint-reconciler-type=none",
		} {
			if !slices.Contains(args, want) {
				t.Errorf("args lack %s: %v", want, args)
			}
		}
	})
	t.Run("extra flags replace framework flags in place and add new ones", func(t *testing.T) {
		c, _ := newConfig(Options{ExtraAPIServerFlags: []string{"--authorization-mode=RBAC", "--v=4", "--profiling", "--v=5"}})
		args := apiServerArgs(c, 6443, "http://127.0.0.1:2379", files)
		count := func(prefix string) int {
			n := 0
			for _, a := range args {
				if strings.HasPrefix(a, prefix) {
					n++
				}
			}
			return n
		}
		if count("--authorization-mode") != 1 || !slices.Contains(args, "--authorization-mode=RBAC") {
			t.Errorf("authorization-mode not replaced: %v", args)
		}
		if count("--v=") != 1 || !slices.Contains(args, "--v=5") {
			t.Errorf("repeated extra flag not collapsed to its last value: %v", args)
		}
		if args[len(args)-1] != "--profiling" {
			t.Errorf("bare extra flag not appended: %v", args)
		}
	})
}

func TestEtcdArgsListenOnLoopbackOnly(t *testing.T) {
	args := etcdArgs("/d/etcd", 2379, 2380)
	for _, want := range []string{
		"--data-dir=/d/etcd",
		"--listen-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=sluice=http://127.0.0.1:2380",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("args lack %s: %v", want, args)
		}
	}
}

func TestSplitFlag(t *testing.T) {
	tests := []struct {
		in, name, value string
		ok              bool
	}{
		{in: "--v=4", name: "v", value: "4", ok: true},
		{in: "--feature-gates=A=true,B=false", name: "feature-gates", value: "A=true,B=false", ok: true},
		{in: "--profiling", name: "profiling", ok: true},
		{in: "--token=", name: "token", ok: true},
		{in: "-v=4"},
		{in: "---v"},
		{in: "--"},
		{in: "--=x"},
	}
	for _, tt := range tests {
		name, value, err := splitFlag(tt.in)
		if (err == nil) != tt.ok || name != tt.name || value != tt.value {
			t.Errorf("splitFlag(%q) = %q, %q, %v; want %q, %q, ok=%v", tt.in, name, value, err, tt.name, tt.value, tt.ok)
		}
	}
}
