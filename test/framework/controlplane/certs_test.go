package controlplane

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"slices"
	"testing"
	"time"
)

func parseCert(t *testing.T, pemData []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(pemData)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %q", pemData)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestServingCertificateVerifiesForEveryAddress(t *testing.T) {
	now := time.Now()
	ca, err := newCertAuthority("test-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("169.254.20.1"), net.ParseIP("fd00:10:96::1")}
	pair, err := ca.issue(certRequest{commonName: "kube-apiserver", ips: ips, dnsNames: []string{"kubernetes.default.svc"}, server: true}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(pair.certPEM, pair.keyPEM); err != nil {
		t.Fatalf("certificate and key do not match: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.certPEM)
	cert := parseCert(t, pair.certPEM)
	for _, host := range []string{"127.0.0.1", "169.254.20.1", "fd00:10:96::1", "kubernetes.default.svc"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verifying for %s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "10.0.0.1", Roots: roots}); err == nil {
		t.Errorf("certificate verifies for an address it was not issued for")
	}
}

func TestClientCertificateCarriesUserAndGroups(t *testing.T) {
	now := time.Now()
	ca, err := newCertAuthority("test-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.issue(certRequest{commonName: AdminUser, organizations: []string{groupMasters}}, now)
	if err != nil {
		t.Fatal(err)
	}
	cert := parseCert(t, pair.certPEM)
	if cert.Subject.CommonName != AdminUser || !slices.Equal(cert.Subject.Organization, []string{groupMasters}) {
		t.Errorf("subject = %v, want CN=%s O=%s", cert.Subject, AdminUser, groupMasters)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.certPEM)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("not a valid client certificate: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Errorf("client certificate also usable for serving")
	}
	if !cert.NotBefore.Before(now) || cert.NotAfter.Before(now.Add(30*24*time.Hour)) {
		t.Errorf("validity %s..%s does not cover now and the next month", cert.NotBefore, cert.NotAfter)
	}
}

func TestServiceAccountKeysArePair(t *testing.T) {
	privPEM, pubPEM, err := serviceAccountKeys()
	if err != nil {
		t.Fatal(err)
	}
	privBlock, _ := pem.Decode(privPEM)
	pubBlock, _ := pem.Decode(pubPEM)
	if privBlock == nil || pubBlock == nil {
		t.Fatal("keys are not PEM")
	}
	priv, err := x509.ParsePKCS8PrivateKey(privBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.ParsePKIXPublicKey(pubBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !priv.(*ecdsa.PrivateKey).PublicKey.Equal(pub) {
		t.Errorf("public key does not belong to the private key")
	}
}
