package app

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/version"
)

// newClient builds the API client from clientConnection, --kubeconfig and --master, the
// way upstream does: an empty kubeconfig and master means in-cluster configuration.
func newClient(o *config.Options) (kubernetes.Interface, error) {
	// Built as a kubernetes.Interface, not a *Clientset, so that on error the caller gets a
	// nil interface rather than one holding a nil *Clientset.
	return clientFor(o, "API client", func(rc *rest.Config) (kubernetes.Interface, error) { return kubernetes.NewForConfig(rc) })
}

// newMetadataClient builds a client for objects' metadata (PartialObjectMetadata) with the
// same connection settings as newClient; it always speaks protobuf.
func newMetadataClient(o *config.Options) (metadata.Interface, error) {
	return clientFor(o, "API metadata client", metadata.NewForConfig)
}

// clientFor builds a client of restConfig's connection with build; what names it in errors.
func clientFor[C any](o *config.Options, what string, build func(*rest.Config) (C, error)) (C, error) {
	var none C
	rc, err := restConfig(o)
	if err != nil {
		return none, err
	}
	client, err := build(rc)
	if err != nil {
		return none, fmt.Errorf("creating the %s: %w", what, err)
	}
	return client, nil
}

// restConfig is the connection newClient and newMetadataClient use.
func restConfig(o *config.Options) (*rest.Config, error) {
	cc := o.Config.ClientConnection
	var rc *rest.Config
	var err error
	if cc.Kubeconfig == "" && o.Master == "" {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig or --master given, and not in a cluster: %w", err)
		}
	} else {
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: cc.Kubeconfig},
			&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: o.Master}}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %q: %w", cc.Kubeconfig, err)
		}
	}
	rc.AcceptContentTypes = cc.AcceptContentTypes
	rc.ContentType = cc.ContentType
	rc.QPS = cc.QPS
	rc.Burst = int(cc.Burst)
	rc.UserAgent = "sluice/" + version.Version
	return rc, nil
}
