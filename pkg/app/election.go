package app

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/events"
	"github.com/sluiceproxy/sluice/pkg/watch"
)

// electEventReporters makes reporter share the Events about the invalid fields of Services
// with the other nodes: each Service's are written by one node, elected among the cluster's
// Nodes, which this starts following (until ctx ends). Problems found before the Nodes are
// listed are written once they are.
func electEventReporters(ctx context.Context, o *config.Options, reporter *events.Reporter) error {
	client, err := newMetadataClient(o)
	if err != nil {
		return err
	}
	nodes, err := watch.NewNodeNames(client)
	if err != nil {
		return fmt.Errorf("watching the Nodes' names: %w", err)
	}
	reporter.SetElectorate(nodes)
	nodes.Start(ctx)
	go func() {
		if !nodes.WaitForSync(ctx) {
			return
		}
		klog.FromContext(ctx).V(2).Info("Nodes listed; InvalidService Events are written by one node per Service")
		reporter.FlushDeferred()
	}()
	return nil
}
