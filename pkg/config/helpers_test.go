package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/kube-proxy/config/v1alpha1"
)

// Test conventions: node "node-a" has IPs 192.168.1.10 and fd00::10 and pod CIDRs
// 10.244.1.0/24 and fd00:244:1::/64; the cluster CIDRs are 10.244.0.0/16 and fd00:244::/56.

// equalConfigs compares two configurations by their encoding, which is what matters for
// a configuration (resource.Quantity caches its string form, so DeepEqual is too strict).
func equalConfigs(a, b *v1alpha1.KubeProxyConfiguration) bool {
	ea, errA := Encode(a)
	eb, errB := Encode(b)
	return errA == nil && errB == nil && bytes.Equal(ea, eb)
}

// writeConfig writes a configuration file for one test and returns its path. A body
// without apiVersion gets the v1alpha1 header.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	if !strings.Contains(body, "apiVersion") {
		body = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + body
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
