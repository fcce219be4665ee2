package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The proxies and modes a run can measure.
const (
	proxySluice   = "sluice"
	proxyUpstream = "kube-proxy"

	modeNFTables       = "nftables"
	modeIPTablesLegacy = "iptables-legacy"
	modeIPTablesNFT    = "iptables-nft"
)

var allModes = []string{modeNFTables, modeIPTablesLegacy, modeIPTablesNFT}

// Ports the proxies serve inside their node namespace, reached over the node's link to
// this program's namespace.
const (
	healthzPort = 10256
	metricsPort = 10249
)

// runSpec is what one run measures: a proxy in a mode.
type runSpec struct {
	Proxy string
	Mode  string
}

func (r runSpec) String() string { return r.Proxy + "/" + r.Mode }

// configMode is the KubeProxyConfiguration mode.
func (r runSpec) configMode() string {
	if r.Mode == modeNFTables {
		return "nftables"
	}
	return "iptables"
}

// xtablesMulti is the multi-call binary of the mode's iptables flavour, "" for nftables.
func (r runSpec) xtablesMulti() string {
	switch r.Mode {
	case modeIPTablesLegacy:
		return "/usr/sbin/xtables-legacy-multi"
	case modeIPTablesNFT:
		return "/usr/sbin/xtables-nft-multi"
	}
	return ""
}

// runSpecs lists the proxy/mode pairs of -proxies x -modes minus -skip, proxies
// alternating within each mode so that a drift in the machine's load hits both alike.
func runSpecs(proxies, modes, skip []string) []runSpec {
	var out []runSpec
	for _, m := range modes {
		for _, p := range proxies {
			r := runSpec{Proxy: p, Mode: m}
			if !slices.Contains(skip, r.String()) {
				out = append(out, r)
			}
		}
	}
	return out
}

// flavourPATH returns a PATH whose iptables, ip6tables and their -save/-restore are the
// mode's flavour: upstream kube-proxy runs whatever `iptables` is on its PATH, and sluice
// takes the flavour installed as `iptables` on a node where neither holds rules yet. The
// links live in dir/<flavour>/.
func flavourPATH(dir string, r runSpec) (string, error) {
	multi := r.xtablesMulti()
	if multi == "" {
		return os.Getenv("PATH"), nil
	}
	binDir := filepath.Join(dir, "xtables-"+strings.TrimPrefix(r.Mode, "iptables-"))
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", err
	}
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			link := filepath.Join(binDir, base+suffix)
			_ = os.Remove(link)
			if err := os.Symlink(multi, link); err != nil {
				return "", fmt.Errorf("flavour link: %w", err)
			}
		}
	}
	return binDir + ":" + os.Getenv("PATH"), nil
}

// xtablesLockEnv gives the iptables programs run on a node a lock file of the node's own
// (XTABLES_LOCKFILE, iptables >= 1.8.5). The legacy flavour takes /run/xtables.lock, one
// file for the whole machine whatever the network namespace: on a shared machine other
// programs' iptables runs would otherwise hold up the proxy under test, as they did in
// trial runs (restores waiting out their --wait). On a real node the proxy is the main
// user of that lock.
func xtablesLockEnv(dir string) string {
	return "XTABLES_LOCKFILE=" + filepath.Join(dir, "xtables.lock")
}

// proxySettings are what varies in the KubeProxyConfiguration between runs.
type proxySettings struct {
	// Mode is the KubeProxyConfiguration mode (runSpec.configMode).
	Mode       string
	Node       string
	Kubeconfig string
	Verbosity  int
	// SyncPeriod and MinSyncPeriod, when not empty, are set in the iptables and nftables
	// sections; empty leaves the proxy's default (upstream's: 30s and 1s).
	SyncPeriod    string
	MinSyncPeriod string
}

// proxyConfig is the KubeProxyConfiguration both proxies run with: upstream's defaults
// (minSyncPeriod 1s, syncPeriod 30s, client QPS 5) except for what a node namespace
// needs: servers bound where this program reaches them, the node's name, and conntrack
// sizing left alone (nf_conntrack_max is global to the machine, not per namespace); and
// the sync periods of s.
func proxyConfig(s proxySettings) string {
	periods := ""
	for _, section := range []string{"iptables", "nftables"} {
		var fields string
		if s.SyncPeriod != "" {
			fields += fmt.Sprintf("  syncPeriod: %s\n", s.SyncPeriod)
		}
		if s.MinSyncPeriod != "" {
			fields += fmt.Sprintf("  minSyncPeriod: %s\n", s.MinSyncPeriod)
		}
		if fields != "" {
			periods += section + ":\n" + fields
		}
	}
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
hostnameOverride: %s
clusterCIDR: 10.244.0.0/16
bindAddress: 0.0.0.0
healthzBindAddress: 0.0.0.0:%d
metricsBindAddress: 0.0.0.0:%d
enableProfiling: true
clientConnection:
  kubeconfig: %s
logging:
  verbosity: %d
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
%s`, s.Mode, s.Node, healthzPort, metricsPort, s.Kubeconfig, s.Verbosity, periods)
}
