package ipvs

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// freshSnapshot is what a node that programmed state from scratch holds.
func freshSnapshot(t *testing.T, state *model.NodeState) string {
	t.Helper()
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{})
	mustApply(t, b, state, model.Changes{Full: true})
	return k.snapshot()
}

// TestRejectedUpdateKeepsTheLastGoodVersion: the kernel rejects one operation in the
// middle of a Service's update (after its ClusterIP moved to new endpoints and its new
// NodePort's virtual server was created): everything of that update is undone, so the
// node holds exactly the Service's previous version, with its set entries and rules; a
// new Service that fails is absent; others in the same sync are programmed.
func TestRejectedUpdateKeepsTheLastGoodVersion(t *testing.T) {
	v1 := fixture.ServicePort("ns/bad", "", model.TCP, "172.30.0.11", 80).Endpoints("10.180.2.3:8080", "10.180.2.4:8080").Build()
	v2 := fixture.ServicePort("ns/bad", "", model.TCP, "172.30.0.11", 80).NodePort(30011).ExternalIPs("192.168.99.11").Scheduler("lc").Endpoints("10.180.2.8:8080", "10.180.2.9:8080").Build()
	other1 := fixture.ServicePort("ns/other", "", model.TCP, "172.30.0.12", 80).Endpoints("10.180.2.5:8080").Build()
	other2 := fixture.ServicePort("ns/other", "", model.TCP, "172.30.0.12", 80).NodePort(30012).Endpoints("10.180.2.6:8080").Build()
	fresh := fixture.ServicePort("ns/new", "", model.TCP, "172.30.0.13", 80).ExternalIPs("192.168.99.13").Endpoints("10.180.2.7:8080").Build()
	for _, tc := range []struct {
		name string
		full bool
	}{{name: "partial sync"}, {name: "full sync", full: true}} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeNode()
			b, _ := newTestBackend(t, k, Settings{})
			mustApply(t, b, stateOf(v1, other1), model.Changes{Full: true})

			faults := map[string]bool{
				"add-rs 192.168.0.2:30011/TCP 10.180.2.8:8080": true, // bad's new NodePort, after its ClusterIP moved
				"add-rs 192.168.99.13:80/TCP 10.180.2.7:8080":  true, // new's externalIP
			}
			k.fault = func(call string) error {
				if faults[call] {
					return errInjected
				}
				return nil
			}
			ch := changed("ns/bad", "ns/other", "ns/new")
			ch.Full = tc.full
			res := b.Apply(context.Background(), stateOf(v2, other2, fresh), ch)
			if res.Err != nil {
				t.Fatalf("the sync failed as a whole: %v", res.Err)
			}
			if len(res.Failed) != 2 || res.Failed[nn("ns/bad")] == nil || res.Failed[nn("ns/new")] == nil {
				t.Fatalf("Failed = %v, want ns/bad and ns/new", res.Failed)
			}
			if diff := cmp.Diff(freshSnapshot(t, stateOf(v1, other2)), k.snapshot()); diff != "" {
				t.Fatalf("the node does not hold the last good versions (-want +got):\n%s", diff)
			}

			// While they wait for their retry, syncs are given their last good versions
			// (model.Tracker.Hold): nothing to do for them.
			mustApply(t, b, stateOf(v1, other2), model.Changes{Full: true})
			if diff := cmp.Diff(freshSnapshot(t, stateOf(v1, other2)), k.snapshot()); diff != "" {
				t.Fatalf("a full sync of the last good versions changed the node (-want +got):\n%s", diff)
			}

			// Fixed: the retry programs them.
			k.fault = nil
			mustApply(t, b, stateOf(v2, other2, fresh), changed("ns/bad", "ns/new"))
			if diff := cmp.Diff(freshSnapshot(t, stateOf(v2, other2, fresh)), k.snapshot()); diff != "" {
				t.Fatalf("after the retry (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRejectedUpdateAfterRestartKeepsWhatTheKernelHeld: a new process does not know a
// Service's last good version; when the kernel rejects its first version of it, the
// Service keeps the virtual servers the kernel held for it instead of losing them.
func TestRejectedUpdateAfterRestartKeepsWhatTheKernelHeld(t *testing.T) {
	v1 := fixture.ServicePort("ns/bad", "", model.TCP, "172.30.0.11", 80).Endpoints("10.180.2.3:8080").Build()
	v2 := fixture.ServicePort("ns/bad", "", model.TCP, "172.30.0.11", 80).Scheduler("ovf").Endpoints("10.180.2.8:8080").Build()
	other := fixture.ServicePort("ns/other", "", model.TCP, "172.30.0.12", 80).Endpoints("10.180.2.5:8080").Build()
	k := newFakeNode()
	old, _ := newTestBackend(t, k, Settings{})
	mustApply(t, old, stateOf(v1, other), model.Changes{Full: true})

	delete(k.schedulers, "ovf")
	b, _ := newTestBackend(t, k, Settings{})
	res := b.Apply(context.Background(), stateOf(v2, other), model.Changes{Full: true})
	if res.Err != nil || len(res.Failed) != 1 || res.Failed[nn("ns/bad")] == nil {
		t.Fatalf("Err=%v Failed=%v", res.Err, res.Failed)
	}
	vs := k.services[vsKey{model.TCP, addr("172.30.0.11"), 80}]
	if vs == nil || vs.params.Scheduler != "rr" || len(vs.dests) != 1 || vs.dests[addrPort("10.180.2.3:8080")] == nil {
		t.Fatalf("the Service lost what the kernel held for it:\n%s", k.dumpIPVS())
	}
}
