package nftables

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane/leftovers"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// The other modes' leftovers are removed by leftovers.RemoveOtherModes after this mode's
// first successful sync (Backend.Apply); the leftovers of this table in another mode are
// removed by Cleanup. Stale chains of this table are deleted by the planner's cleanup group
// (plan.go).

// Cleanup deletes the kube-proxy table of one family (for `sluice cleanup` and mode
// switches), whoever wrote it. A missing table is not an error.
func Cleanup(ctx context.Context, family model.IPFamily) error {
	deleted, err := leftovers.DeleteNFTablesTable(family)
	if err != nil {
		metrics.NFTablesCleanupFailuresTotal.WithLabelValues(family.String()).Inc()
		return err
	}
	if deleted {
		klog.FromContext(ctx).V(2).Info("Deleted the kube-proxy nftables table", "ipFamily", family.String())
	}
	return nil
}
