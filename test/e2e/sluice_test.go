//go:build e2e

package e2e

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
)

func TestSluiceProgramsACreatedService(t *testing.T) {
	ctx := t.Context()
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.AdminClient()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	node, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.10.1"}}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, cp, nodeName, "")
	svc, _ := createServiceWithSlice(ctx, t, admin, "echo", "10.244.1.5")
	p.waitFor(t, "the Service to be programmed", 30*time.Second, func(r *app.StatusReport) bool {
		for _, f := range r.Families {
			for _, sp := range f.State.Services {
				if sp.Name == svc.Name && len(sp.ClusterEndpoints) == 1 && f.Status.LastSuccess.After(time.Time{}) {
					return true
				}
			}
		}
		return false
	})
}
