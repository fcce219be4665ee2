package iptables

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Sysctls the iptables mode reads or sets. Both are per network namespace.
const (
	// sysctlRouteLocalnet lets packets to 127.0.0.0/8 be routed, which localhost NodePorts
	// need (and which https://issues.k8s.io/90259 is about: KUBE-FIREWALL mitigates it).
	sysctlRouteLocalnet = "net/ipv4/conf/all/route_localnet"
	// sysctlTCPBeLiberal, when set, makes conntrack mark only out-of-window RSTs INVALID, so
	// the INVALID drop rule is not needed.
	sysctlTCPBeLiberal = "net/netfilter/nf_conntrack_tcp_be_liberal"
)

// sysctl reads and writes /proc/sys. A seam for tests.
type sysctl interface {
	Get(name string) (int, error)
	Set(name string, value int) error
}

// procSysctl is the real sysctl, rooted at /proc/sys.
type procSysctl struct{ root string }

func (p procSysctl) path(name string) string { return filepath.Join(p.root, name) }

func (p procSysctl) Get(name string) (int, error) {
	b, err := os.ReadFile(p.path(name))
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: %w", name, err)
	}
	return v, nil
}

func (p procSysctl) Set(name string, value int) error {
	return os.WriteFile(p.path(name), []byte(strconv.Itoa(value)+"\n"), 0o640)
}

// ensureSysctl sets name to value unless it already has it.
func ensureSysctl(s sysctl, name string, value int) error {
	if v, err := s.Get(name); err == nil && v == value {
		return nil
	}
	if err := s.Set(name, value); err != nil {
		return fmt.Errorf("setting sysctl %s=%d: %w", name, value, err)
	}
	return nil
}
