package controlplane

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultServiceCIDR is the Service ClusterIP range when Options.ServiceCIDRs is empty,
// kubeadm's default.
const DefaultServiceCIDR = "10.96.0.0/16"

// DefaultServiceCIDRv6 is the IPv6 range DualStackServiceCIDRs pairs with
// DefaultServiceCIDR. /112 stays inside the size every kube-apiserver version accepts for
// the flag's IPv6 range.
const DefaultServiceCIDRv6 = "fd00:10:96::/112"

// DualStackServiceCIDRs returns an IPv4,IPv6 pair for Options.ServiceCIDRs.
func DualStackServiceCIDRs() []string {
	return []string{DefaultServiceCIDR, DefaultServiceCIDRv6}
}

// defaultBindAddress keeps the apiserver off every interface but loopback.
const defaultBindAddress = "127.0.0.1"

// config is Options validated and with defaults filled in.
type config struct {
	bindAddress  netip.Addr
	serviceCIDRs []netip.Prefix
	extraFlags   []string
}

// newConfig validates o and fills in defaults. It reads nothing from the machine.
func newConfig(o Options) (config, error) {
	var c config
	bind := o.BindAddress
	if bind == "" {
		bind = defaultBindAddress
	}
	addr, err := netip.ParseAddr(bind)
	if err != nil {
		return c, fmt.Errorf("bind address %q: %w", bind, err)
	}
	if addr.IsUnspecified() || addr.Zone() != "" {
		// The address is also the advertise address and the URL clients dial: it has to
		// name one reachable interface address.
		return c, fmt.Errorf("bind address %q: must be a specific address without zone, not a wildcard", bind)
	}
	c.bindAddress = addr.Unmap()

	cidrs := o.ServiceCIDRs
	if len(cidrs) == 0 {
		cidrs = []string{DefaultServiceCIDR}
	}
	if len(cidrs) > 2 {
		return c, fmt.Errorf("service CIDRs %v: at most two (one per IP family)", cidrs)
	}
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return c, fmt.Errorf("service CIDR %q: %w", s, err)
		}
		if p != p.Masked() {
			return c, fmt.Errorf("service CIDR %q: host bits set (did you mean %s?)", s, p.Masked())
		}
		c.serviceCIDRs = append(c.serviceCIDRs, p)
	}
	if len(c.serviceCIDRs) == 2 && c.serviceCIDRs[0].Addr().Is4() == c.serviceCIDRs[1].Addr().Is4() {
		return c, fmt.Errorf("service CIDRs %v: a dual-stack pair needs one IPv4 and one IPv6 range", cidrs)
	}

	for _, f := range o.ExtraAPIServerFlags {
		if _, _, err := splitFlag(f); err != nil {
			return c, err
		}
	}
	c.extraFlags = o.ExtraAPIServerFlags
	return c, nil
}

// kubernetesServiceIPs returns the ClusterIP kube-apiserver gives the "kubernetes" Service
// in each Service range: the first address after the network address.
func kubernetesServiceIPs(cidrs []netip.Prefix) []netip.Addr {
	ips := make([]netip.Addr, 0, len(cidrs))
	for _, p := range cidrs {
		ips = append(ips, p.Masked().Addr().Next())
	}
	return ips
}

// servingCertSANs lists every address and name kube-apiserver is reached on: loopback
// (in-process clients and tests), the bind address (node network namespaces), and the
// kubernetes Service's ClusterIPs and DNS names (pods behind a proxy).
func servingCertSANs(c config) (ips []net.IP, dnsNames []string) {
	seen := map[netip.Addr]bool{}
	add := func(a netip.Addr) {
		if !seen[a] {
			seen[a] = true
			ips = append(ips, net.IP(a.AsSlice()))
		}
	}
	add(netip.MustParseAddr("127.0.0.1"))
	add(netip.IPv6Loopback())
	add(c.bindAddress)
	for _, a := range kubernetesServiceIPs(c.serviceCIDRs) {
		add(a)
	}
	dnsNames = []string{
		"localhost",
		"kubernetes",
		"kubernetes.default",
		"kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local",
	}
	return ips, dnsNames
}

// endpointReconcilerType picks kube-apiserver's --endpoint-reconciler-type for an
// advertise address. The reconciler publishes the advertise address as the endpoint of
// the "kubernetes" Service, and endpoint validation rejects loopback and link-local
// addresses; kube-apiserver 1.37 checks this at start and exits ("cannot use public IP
// 169.254.20.1 with endpoint reconciler"). Such control planes run without the
// reconciler: the "kubernetes" Service still exists, without endpoints.
func endpointReconcilerType(advertise netip.Addr) string {
	if advertise.IsLoopback() || advertise.IsLinkLocalUnicast() {
		return "none"
	}
	return "lease"
}

// apiServerFiles are the files kube-apiserver reads.
type apiServerFiles struct {
	caCert, servingCert, servingKey string
	serviceAccountKey               string // private; signs tokens
	serviceAccountPub               string // public; verifies them
	certDir                         string
}

// flag is one --name=value argument of the framework's own.
type flag struct{ name, value string }

// apiServerArgs renders kube-apiserver's command line. Extra flags replace a framework
// flag of the same name instead of repeating it: kube-apiserver appends repeated list
// flags (--authorization-mode) rather than keeping the last one.
func apiServerArgs(c config, port int, etcdURL string, files apiServerFiles) []string {
	cidrs := make([]string, len(c.serviceCIDRs))
	for i, p := range c.serviceCIDRs {
		cidrs[i] = p.String()
	}
	base := []flag{
		{"bind-address", c.bindAddress.String()},
		{"advertise-address", c.bindAddress.String()},
		{"secure-port", strconv.Itoa(port)},
		{"etcd-servers", etcdURL},
		{"tls-cert-file", files.servingCert},
		{"tls-private-key-file", files.servingKey},
		{"client-ca-file", files.caCert},
		{"cert-dir", files.certDir},
		{"authorization-mode", "Node,RBAC"},
		{"service-account-issuer", "https://kubernetes.default.svc.cluster.local"},
		{"service-account-key-file", files.serviceAccountPub},
		{"service-account-signing-key-file", files.serviceAccountKey},
		{"service-cluster-ip-range", strings.Join(cidrs, ",")},
		{"endpoint-reconciler-type", endpointReconcilerType(c.bindAddress)},
		// On SIGTERM, answer new requests with 429 and Retry-After while in-flight ones
		// drain, then give open watches 2s. Without it, a graceful stop waits out the 60s
		// request timeout for every open watch (sluice always has some) before closing them.
		{"shutdown-send-retry-after", "true"},
	}
	return mergeFlags(base, c.extraFlags)
}

// etcdArgs renders etcd's command line for a single member on loopback.
func etcdArgs(dataDir string, clientPort, peerPort int) []string {
	clientURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))
	peerURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))
	const name = "sluice"
	return mergeFlags([]flag{
		{"name", name},
		{"data-dir", filepath.Clean(dataDir)},
		{"listen-client-urls", clientURL},
		{"advertise-client-urls", clientURL},
		{"listen-peer-urls", peerURL},
		{"initial-advertise-peer-urls", peerURL},
		{"initial-cluster", name + "=" + peerURL},
		// A test cluster's data is thrown away with the directory; not waiting for the
		// disk makes every write (and so start-up's bootstrap objects) much faster.
		{"unsafe-no-fsync", "true"},
		{"log-level", "warn"},
	}, nil)
}

// mergeFlags renders base with each extra "--name[=value]" replacing the base flag of the
// same name in place, or appended when there is none. extra must have passed splitFlag.
func mergeFlags(base []flag, extra []string) []string {
	args := make([]string, len(base))
	index := make(map[string]int, len(base))
	for i, f := range base {
		args[i] = "--" + f.name + "=" + f.value
		index[f.name] = i
	}
	for _, e := range extra {
		name, _, _ := splitFlag(e)
		if i, ok := index[name]; ok {
			args[i] = e
			continue
		}
		index[name] = len(args)
		args = append(args, e)
	}
	return args
}

// splitFlag parses "--name=value" or "--name".
func splitFlag(s string) (name, value string, err error) {
	rest, ok := strings.CutPrefix(s, "--")
	if !ok || rest == "" || strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "=") {
		return "", "", fmt.Errorf("extra flag %q: want --name=value or --name", s)
	}
	name, value, _ = strings.Cut(rest, "=")
	return name, value, nil
}
