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
	rc, err := restConfig(o)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	return client, nil
}

// newMetadataClient builds a client for objects' metadata (PartialObjectMetadata) with the
// same connection settings as newClient; it always speaks protobuf.
func newMetadataClient(o *config.Options) (metadata.Interface, error) {
	rc, err := restConfig(o)
	if err != nil {
		return nil, err
	}
	client, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating the API metadata client: %w", err)
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
