package controlplane

import (
	"fmt"
	"path/filepath"
	"regexp"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Identities the control plane issues certificates for at start.
const (
	// AdminUser is the admin identity; it is in the group system:masters, which RBAC lets
	// do anything.
	AdminUser = "admin"
	// ProxyUser is kube-proxy's user. Upstream's bootstrap RBAC policy binds it to the
	// ClusterRole system:node-proxier (ClusterRoleBinding system:node-proxier): list and
	// watch Services, EndpointSlices, Endpoints and ServiceCIDRs, get/list/watch Nodes,
	// create/update/patch Events. That is all sluice may do.
	ProxyUser = "system:kube-proxy"
	// ProxierClusterRole is the ClusterRole (and bootstrap ClusterRoleBinding) for ProxyUser.
	ProxierClusterRole = "system:node-proxier"
)

// groupMasters is the group that bypasses RBAC.
const groupMasters = "system:masters"

// clientQPS and clientBurst lift client-go's default rate limit (5 QPS) for the admin
// client, which tests use to create thousands of objects; identities keep the default.
const (
	clientQPS   = 1000
	clientBurst = 2000
)

// RESTConfigFor returns a client configuration authenticating as user, a member of
// groups, with a fresh client certificate signed by the control plane's CA. The identity
// has only the permissions RBAC gives that user or those groups.
func (cp *ControlPlane) RESTConfigFor(user string, groups ...string) (*rest.Config, error) {
	pair, err := cp.ca.issue(certRequest{commonName: user, organizations: groups}, time.Now())
	if err != nil {
		return nil, fmt.Errorf("issuing client certificate for %q: %w", user, err)
	}
	return &rest.Config{
		Host: cp.url,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   cp.ca.certPEM,
			CertData: pair.certPEM,
			KeyData:  pair.keyPEM,
		},
	}, nil
}

// KubeconfigFor writes a kubeconfig file authenticating as user, a member of groups, and
// returns its path (inside the control plane's directory, removed by Stop). Each call
// issues a new certificate and writes a new file.
func (cp *ControlPlane) KubeconfigFor(user string, groups ...string) (string, error) {
	cfg, err := cp.RESTConfigFor(user, groups...)
	if err != nil {
		return "", err
	}
	cp.mu.Lock()
	cp.kubeconfigSeq++
	name := fmt.Sprintf("%s-%d.kubeconfig", fileSafe(user), cp.kubeconfigSeq)
	cp.mu.Unlock()
	path := filepath.Join(cp.dir, name)
	if err := writeKubeconfig(path, user, cfg); err != nil {
		return "", err
	}
	return path, nil
}

// writeKubeconfig writes cfg (server, CA and client certificate, all embedded) as a
// kubeconfig with a single context, current.
func writeKubeconfig(path, user string, cfg *rest.Config) error {
	const name = "sluice-e2e"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: user}
	kc.CurrentContext = name
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

var unsafeFileChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// fileSafe turns a user name such as "system:node:n1" into "system-node-n1".
func fileSafe(user string) string {
	s := unsafeFileChars.ReplaceAllString(user, "-")
	if s == "" || s == "." || s == ".." {
		return "user"
	}
	return s
}
