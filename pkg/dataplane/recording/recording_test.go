package recording

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Test conventions: the shared fixture's (pkg/dataplane/internal/fixture): ClusterIPs are
// 172.30.0.x, the node fixture.Node(). A Service "version" is
// its port number, so tests can see which version of a Service is programmed.

var (
	svcA = types.NamespacedName{Namespace: "ns", Name: "a"}
	svcB = types.NamespacedName{Namespace: "ns", Name: "b"}
	svcC = types.NamespacedName{Namespace: "ns", Name: "c"}
)

func port(name types.NamespacedName, ip byte, p int32) *model.ServicePort {
	return fixture.ServicePort(name.String(), "", model.TCP, netip.AddrFrom4([4]byte{172, 30, 0, ip}).String(), p).Build()
}

// state builds a state with one port per Service, at the given port numbers.
func state(ports map[types.NamespacedName]int32) *model.NodeState {
	st := fixture.NodeState(model.IPv4, fixture.Node())
	for name, p := range ports {
		// The ClusterIP comes from the name, so that a Service is the same in every state.
		st.SetService(name, []*model.ServicePort{port(name, name.Name[0], p)}, nil)
	}
	return st
}

func changed(full bool, names ...types.NamespacedName) model.Changes {
	return model.Changes{Full: full, Services: sets.New(names...)}
}

// programmedPorts returns Service → port number of what b has programmed.
func programmedPorts(b *Backend) map[types.NamespacedName]int32 {
	out := map[types.NamespacedName]int32{}
	st := b.Programmed()
	for name := range st.ServiceNames() {
		out[name] = st.PortsOf(name)[0].Port
	}
	return out
}

func wantPorts(t *testing.T, b *Backend, want map[types.NamespacedName]int32) {
	t.Helper()
	got := programmedPorts(b)
	if len(got) != len(want) {
		t.Fatalf("programmed %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("programmed %v, want %v", got, want)
		}
	}
}

func TestRecordsLastStateAndChangesAsCopies(t *testing.T) {
	b := New(model.IPv4)
	if _, _, ok := b.Last(); ok {
		t.Fatal("Last() reported an apply before the first")
	}
	desired := state(map[types.NamespacedName]int32{svcA: 80})
	ch := changed(true, svcA)
	if res := b.Apply(context.Background(), desired, ch); res.Err != nil || len(res.Failed) != 0 || !res.Full {
		t.Fatalf("Apply = %+v, want a successful full apply", res)
	}
	// The caller goes on changing its state and set; the recording must not change.
	desired.SetService(svcB, []*model.ServicePort{port(svcB, 9, 81)}, nil)
	ch.Services.Insert(svcB)

	last, lastCh, ok := b.Last()
	if !ok || !last.ServiceNames().Equal(sets.New(svcA)) {
		t.Errorf("Last() state has %v, want only ns/a", last.ServiceNames())
	}
	if !lastCh.Full || !lastCh.Services.Equal(sets.New(svcA)) {
		t.Errorf("Last() changes = %+v, want full with ns/a", lastCh)
	}
	// Nor may the reader change the recording.
	last.SetService(svcC, []*model.ServicePort{port(svcC, 3, 82)}, nil)
	lastCh.Services.Insert(svcC)
	again, againCh, _ := b.Last()
	if again.ServiceNames().Has(svcC) || againCh.Services.Has(svcC) {
		t.Error("changing what Last() returned changed the recording")
	}
}

func TestCountsApplies(t *testing.T) {
	b := New(model.IPv6)
	st := model.NewNodeState(model.IPv6, model.NodeInfo{})
	b.Apply(context.Background(), st, changed(true))
	b.Apply(context.Background(), st, changed(false))
	b.Apply(context.Background(), st, changed(false))
	if total, full := b.Applies(); total != 3 || full != 1 {
		t.Errorf("Applies() = %d, %d; want 3, 1", total, full)
	}
	if b.Family() != model.IPv6 || b.Mode() != "recording" {
		t.Errorf("Family/Mode = %v/%v", b.Family(), b.Mode())
	}
}

func TestProgrammedFollowsOnlyTheChangesItIsGiven(t *testing.T) {
	b := New(model.IPv4)
	ctx := context.Background()
	b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 80, svcB: 80}), changed(true))
	wantPorts(t, b, map[types.NamespacedName]int32{svcA: 80, svcB: 80})

	// Both changed, but the sync loop only says a did: b keeps its old version. This is
	// what lets tests catch a sync loop that loses changes.
	b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 81, svcB: 81}), changed(false, svcA))
	wantPorts(t, b, map[types.NamespacedName]int32{svcA: 81, svcB: 80})

	// A deleted Service named in the changes disappears.
	b.Apply(ctx, state(map[types.NamespacedName]int32{svcB: 81}), changed(false, svcA))
	wantPorts(t, b, map[types.NamespacedName]int32{svcB: 80})

	// A partial apply without a set changes nothing.
	b.Apply(ctx, state(map[types.NamespacedName]int32{svcB: 83}), model.Changes{})
	wantPorts(t, b, map[types.NamespacedName]int32{svcB: 80})

	// A full apply catches up with everything.
	b.Apply(ctx, state(map[types.NamespacedName]int32{svcB: 82, svcC: 80}), changed(true))
	wantPorts(t, b, map[types.NamespacedName]int32{svcB: 82, svcC: 80})
}

func TestFailedServiceIsReportedAndKeepsItsOldVersion(t *testing.T) {
	b := New(model.IPv4)
	ctx := context.Background()
	boom := errors.New("injected")
	b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 80, svcB: 80, svcC: 80}), changed(true))
	b.FailService(svcB, boom)

	// b is not among the changes: nothing to program for it, nothing fails.
	res := b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 81, svcB: 80, svcC: 80}), changed(false, svcA))
	if res.Err != nil || len(res.Failed) != 0 {
		t.Fatalf("Apply = %+v, want success", res)
	}

	// b and c changed: b fails, c is programmed.
	res = b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 81, svcB: 81, svcC: 81}), changed(false, svcB, svcC))
	if res.Err != nil || len(res.Failed) != 1 || !errors.Is(res.Failed[svcB], boom) {
		t.Fatalf("Apply = %+v, want only ns/b failed", res)
	}
	wantPorts(t, b, map[types.NamespacedName]int32{svcA: 81, svcB: 80, svcC: 81})
	if r := b.LastResult(); len(r.Failed) != 1 {
		t.Errorf("LastResult() = %+v", r)
	}

	// A full apply also tries b, and fails it again.
	res = b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 81, svcB: 81, svcC: 81}), changed(true))
	if len(res.Failed) != 1 || res.Failed[svcB] == nil {
		t.Fatalf("full Apply = %+v, want ns/b failed", res)
	}

	// A full apply that finds b as it is programmed has nothing to write for it, and
	// nothing to fail.
	res = b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 81, svcB: 80, svcC: 81}), changed(true))
	if res.Err != nil || len(res.Failed) != 0 {
		t.Fatalf("full Apply with b unchanged = %+v, want success", res)
	}

	// Once the failure is lifted the retry (the loop marks b changed again) programs it.
	b.FailService(svcB, nil)
	res = b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 81, svcB: 81, svcC: 81}), changed(false, svcB))
	if res.Err != nil || len(res.Failed) != 0 {
		t.Fatalf("Apply = %+v, want success", res)
	}
	wantPorts(t, b, map[types.NamespacedName]int32{svcA: 81, svcB: 81, svcC: 81})
}

func TestWholeApplyFailure(t *testing.T) {
	b := New(model.IPv4)
	ctx := context.Background()
	b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 80}), changed(true))
	boom := errors.New("injected")
	b.FailApply(boom)
	res := b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 81, svcB: 80}), changed(false, svcA, svcB))
	if !errors.Is(res.Err, boom) {
		t.Fatalf("Apply = %+v, want the injected error", res)
	}
	wantPorts(t, b, map[types.NamespacedName]int32{svcA: 80})
	// What it was asked is still recorded.
	if last, _, _ := b.Last(); !last.ServiceNames().Has(svcB) {
		t.Error("a failed apply was not recorded")
	}
	b.FailApply(nil)
	if res := b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 81, svcB: 80}), changed(true)); res.Err != nil {
		t.Fatalf("Apply after FailApply(nil) = %+v", res)
	}
	wantPorts(t, b, map[types.NamespacedName]int32{svcA: 81, svcB: 80})
}

func TestCancelledContextFailsTheApply(t *testing.T) {
	b := New(model.IPv4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res := b.Apply(ctx, state(map[types.NamespacedName]int32{svcA: 80}), changed(true)); !errors.Is(res.Err, context.Canceled) {
		t.Errorf("Apply = %+v, want context.Canceled", res)
	}
}

func TestWaitForApplies(t *testing.T) {
	b := New(model.IPv4)
	go func() {
		for range 3 {
			b.Apply(context.Background(), state(nil), changed(false))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.WaitForApplies(ctx, 3); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelShort()
	if err := b.WaitForApplies(short, 4); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitForApplies beyond the applies = %v, want a deadline error", err)
	}
}

func TestWriteJSONIsTheStateView(t *testing.T) {
	b := New(model.IPv4)
	var before bytes.Buffer
	if err := b.WriteJSON(&before); err != nil {
		t.Fatal(err)
	}
	var empty model.StateView
	if err := json.Unmarshal(before.Bytes(), &empty); err != nil || empty.Family != "IPv4" || len(empty.Services) != 0 {
		t.Errorf("dump before any apply = %s (err %v), want an empty IPv4 state", before.String(), err)
	}

	desired := state(map[types.NamespacedName]int32{svcA: 80, svcB: 443})
	b.Apply(context.Background(), desired, changed(true))
	var out bytes.Buffer
	if err := b.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	want, _ := json.MarshalIndent(desired.View(), "", "  ")
	if out.String() != string(want)+"\n" {
		t.Errorf("WriteJSON wrote\n%s\nwant\n%s", out.String(), want)
	}
	v, ok := b.View()
	if !ok || v.Find("ns", "b", "", model.TCP).Port != 443 {
		t.Errorf("View() = %+v, %v", v, ok)
	}
}
