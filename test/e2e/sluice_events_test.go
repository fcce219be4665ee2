//go:build e2e

package e2e

// Events stay bounded across the cluster: two sluice processes (recording backend) play
// two nodes of one control plane, and bad Services, which both see, get one InvalidService
// Event each, from the node elected for that Service; both still count the problems.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/events"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/watch"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
)

func TestInvalidServiceIsReportedByOneNode(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	c := cp.AdminClient()
	nodes := []string{"node-a", "node-b"}
	createNode(t, c, nodes[0], "192.168.10.1")
	createNode(t, c, nodes[1], "192.168.10.2")
	procs := []*sluiceProcess{startSluice(t, cp, nodes[0], ""), startSluice(t, cp, nodes[1], "")}

	const bad = 6
	ns := newNamespace(t, c, "events")
	ports := []discoveryv1.EndpointPort{tcpPort("http", 8080)}
	var names []string
	for i := range bad {
		name := fmt.Sprintf("sched-%d", i)
		names = append(names, name)
		svc := clusterIPService(ns, name)
		svc.Annotations = map[string]string{watch.AnnotationScheduler: "bogus"}
		createService(t, c, svc)
		createSlice(t, c, endpointSlice(ns, name, name+"-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint(fmt.Sprintf("10.244.7.%d", i+1), nodes[0])))
	}

	// Both nodes see every problem, and count it.
	for i, p := range procs {
		p.waitFor(t, nodes[i]+" to see the problems of every bad Service", 60*time.Second, func(r *app.StatusReport) bool {
			for _, name := range names {
				if len(problemsOf(r, model.IPv4, ns, name)) == 0 {
					return false
				}
			}
			return true
		})
		p.waitForMetrics(t, nodes[i]+" to count the problems", 10*time.Second, func(m metricFamilies) bool {
			v, _ := m.value("sluice_input_problems_total", "kind", "Service")
			return v >= bad
		})
	}

	// One Event per Service, from its elected node. Wait for all of them, then long
	// enough for a second node's Event to have arrived too, had it written one.
	reporters := func() map[string][]string {
		list, err := c.EventsV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, ev := range list.Items {
			if ev.Reason != events.ReasonInvalidService {
				continue
			}
			reporter := "?"
			for _, n := range nodes {
				if strings.Contains(ev.Note, "node "+n+" reports it for all") {
					reporter = n
				}
			}
			out[ev.Regarding.Name] = append(out[ev.Regarding.Name], reporter)
		}
		return out
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(reporters()) < bad {
		if time.Now().After(deadline) {
			t.Fatalf("InvalidService Events after 60 s: %v", reporters())
		}
		time.Sleep(pollInterval)
	}
	time.Sleep(5 * time.Second)
	got := reporters()
	for _, name := range names {
		want := events.ElectedNode(ns+"/"+name, slices.Values(nodes))
		if !slices.Equal(got[name], []string{want}) {
			t.Errorf("%s: InvalidService Events from %v, want one from %s", name, got[name], want)
		}
	}
}
