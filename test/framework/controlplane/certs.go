package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// certValidity is long enough for a sandbox left running for weeks; these certificates
// never leave the machine and die with the control plane's directory.
const certValidity = 365 * 24 * time.Hour

// clockSkew backdates NotBefore so a certificate is valid at once even if a process reads
// the clock slightly differently (or a VM's clock lags).
const clockSkew = time.Hour

// certAuthority signs every certificate of one control plane: the apiserver's serving
// certificate and the client certificates of all identities. kube-apiserver trusts it
// through --client-ca-file, clients through the kubeconfig's certificate-authority-data.
type certAuthority struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

// keyPair is a PEM-encoded certificate and its PKCS#8 private key.
type keyPair struct {
	certPEM []byte
	keyPEM  []byte
}

// certRequest describes a leaf certificate. Server certificates carry the addresses and
// names they are reached on; client certificates carry the identity kube-apiserver's
// x509 authenticator reads: the user from the Common Name, the groups from Organization.
type certRequest struct {
	commonName    string
	organizations []string
	ips           []net.IP
	dnsNames      []string
	server        bool
}

// newKey returns a P-256 key: quick to generate (a control plane makes several per start)
// and accepted by kube-apiserver and client-go for TLS and service-account signing alike.
func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating P-256 key: %w", err)
	}
	return key, nil
}

func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	return serial, nil
}

// newCertAuthority creates a self-signed CA valid from now.
func newCertAuthority(commonName string, now time.Time) (*certAuthority, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-signing CA %q: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	return &certAuthority{cert: cert, key: key, certPEM: pemBlock("CERTIFICATE", der)}, nil
}

// issue creates a key and a certificate for req, signed by ca and valid from now.
func (ca *certAuthority) issue(req certRequest, now time.Time) (keyPair, error) {
	key, err := newKey()
	if err != nil {
		return keyPair{}, err
	}
	serial, err := randomSerial()
	if err != nil {
		return keyPair{}, err
	}
	usage := x509.ExtKeyUsageClientAuth
	if req.server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.commonName, Organization: req.organizations},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  req.ips,
		DNSNames:     req.dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return keyPair{}, fmt.Errorf("signing certificate for %q: %w", req.commonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return keyPair{}, fmt.Errorf("encoding key for %q: %w", req.commonName, err)
	}
	return keyPair{certPEM: pemBlock("CERTIFICATE", der), keyPEM: pemBlock("PRIVATE KEY", keyDER)}, nil
}

// serviceAccountKeys returns a signing key for kube-apiserver's
// --service-account-signing-key-file and its public half for --service-account-key-file.
func serviceAccountKeys() (privatePEM, publicPEM []byte, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, nil, fmt.Errorf("encoding service-account public key: %w", err)
	}
	return pemBlock("PRIVATE KEY", privDER), pemBlock("PUBLIC KEY", pubDER), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
