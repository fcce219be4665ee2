package controlplane

import (
	"crypto/x509"
	"encoding/pem"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

func TestKubeconfigForCarriesTheIdentity(t *testing.T) {
	ca, err := newCertAuthority("test-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cp := &ControlPlane{ca: ca, url: "https://169.254.20.1:6443", dir: t.TempDir()}
	path, err := cp.KubeconfigFor("system:node:node-1", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "system-node-node-1-1.kubeconfig" {
		t.Errorf("file name = %s", filepath.Base(path))
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != cp.url {
		t.Errorf("server = %s, want %s", cfg.Host, cp.url)
	}
	block, _ := pem.Decode(cfg.CertData)
	if block == nil {
		t.Fatal("no client certificate in kubeconfig")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "system:node:node-1" || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("subject = %v", cert.Subject)
	}
	if string(cfg.CAData) != string(ca.certPEM) {
		t.Errorf("kubeconfig does not trust the control plane's CA")
	}

	second, err := cp.KubeconfigFor("system:node:node-1")
	if err != nil {
		t.Fatal(err)
	}
	if second == path {
		t.Errorf("second kubeconfig overwrote the first")
	}
}

func TestFileSafe(t *testing.T) {
	for in, want := range map[string]string{
		"system:kube-proxy":  "system-kube-proxy",
		"admin":              "admin",
		"a/b c":              "a-b-c",
		"..":                 "user",
		"":                   "user",
		"user@example.com":   "user-example.com",
		"system:node:node-1": "system-node-node-1",
	} {
		if got := fileSafe(in); got != want {
			t.Errorf("fileSafe(%q) = %q, want %q", in, got, want)
		}
	}
}
