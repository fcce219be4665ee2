package nftables

import (
	"strings"
	"syscall"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// fakeSender plays the kernel for the applier: it rejects every batch holding a message
// that adds a rule to a chain named in bad, attributing the error to that message (or,
// with unattributed, to the batch as a whole, as a failure at commit would be).
type fakeSender struct {
	bad map[string]bool
	// badSets: deleting elements from these sets is rejected too (ENOENT).
	badSets      map[string]bool
	unattributed bool
	batches      [][]string // chains written by each committed batch
	sent         int
}

func (s *fakeSender) sendBatch(msgs []byte, count int) ([]batchError, error) {
	s.sent++
	var chains []string
	var errs []batchError
	i := 0
	for _, m := range splitMessages(msgs) {
		if m.typ == msgType(0x0e) { // NFT_MSG_DELSETELEM
			for it := newAttrIter(m.data[nfgenHdrLen:]); it.next(); {
				if it.typ == 2 && s.badSets[it.str()] { // NFTA_SET_ELEM_LIST_SET
					errs = append(errs, batchError{index: i, errno: syscall.ENOENT})
				}
			}
		}
		if m.typ == msgType(0x06) { // NFT_MSG_NEWRULE
			for it := newAttrIter(m.data[nfgenHdrLen:]); it.next(); {
				if it.typ == 2 { // NFTA_RULE_CHAIN
					chains = append(chains, it.str())
					if s.bad[it.str()] {
						idx := i
						if s.unattributed {
							idx = -1
						}
						errs = append(errs, batchError{index: idx, errno: syscall.ENOENT})
					}
				}
			}
		}
		i++
	}
	if len(errs) > 0 {
		if s.unattributed {
			return errs[:1], nil
		}
		return errs, nil
	}
	s.batches = append(s.batches, chains)
	return nil, nil
}

func TestApplierLeavesOutRejectedServices(t *testing.T) {
	for _, unattributed := range []bool{false, true} {
		k := newFakeKernel(testConfig(model.IPv4))
		ns := scaleState(model.IPv4, 40, 1)
		p := k.plan(ns, model.Changes{Full: true})
		badSvc := types.NamespacedName{Namespace: "ns7", Name: "svc7"}
		badChain := chainNamesFor(model.ServicePortName{NamespacedName: badSvc, Port: "http", Protocol: model.TCP}).cluster
		s := &fakeSender{bad: map[string]bool{badChain: true}, unattributed: unattributed}
		a := &applier{c: s, f: ipv4, limits: batchLimits{bytes: 4096, messages: 50}}
		res := a.apply(p)
		if res.err != nil {
			t.Fatalf("unattributed=%v: %v", unattributed, res.err)
		}
		if len(res.failed) != 1 || res.failed[badSvc] == nil {
			t.Fatalf("unattributed=%v: failed = %v, want only %v", unattributed, res.failed, badSvc)
		}
		if !unattributed && !strings.Contains(res.failed[badSvc].Error(), "add rule to chain "+badChain) {
			t.Errorf("the error does not say what failed: %v", res.failed[badSvc])
		}
		applied := 0
		for i, g := range p.groups {
			if g.service == badSvc {
				if g.applied {
					t.Errorf("the rejected group was applied")
				}
				continue
			}
			if !g.applied {
				t.Errorf("group %d (%v) not applied", i, g.service)
			}
			applied++
		}
		for _, b := range s.batches {
			for _, ch := range b {
				if ch == badChain {
					t.Errorf("a committed batch holds the bad chain")
				}
			}
		}
		t.Logf("unattributed=%v: %d groups applied in %d batches, %d sends", unattributed, applied, len(s.batches), s.sent)
	}
}

func TestApplierFailsWhenTheFixedPartIsRejected(t *testing.T) {
	k := newFakeKernel(testConfig(model.IPv4))
	p := k.plan(scaleState(model.IPv4, 3, 1), model.Changes{Full: true})
	s := &fakeSender{bad: map[string]bool{servicesChain: true}}
	res := (&applier{c: s, f: ipv4, limits: defaultBatchLimits}).apply(p)
	if res.err == nil || !strings.Contains(res.err.Error(), "fixed part") {
		t.Fatalf("err = %v", res.err)
	}
}

// TestRejectedCleanupLeavesTheServicesProgrammed: the kernel refuses to delete a
// leftover endpoint map element (ENOENT, as in issue 14's churn). The sync fails as a
// cleanup failure, but the Services in the same batch are programmed all the same.
func TestRejectedCleanupLeavesTheServicesProgrammed(t *testing.T) {
	k := newFakeKernel(testConfig(model.IPv4))
	ns := scaleState(model.IPv4, 20, 2)
	k.apply(ns, model.Changes{Full: true})
	gone := types.NamespacedName{Namespace: "ns7", Name: "svc7"}
	set := k.state.services[gone].slots[0].set
	ns.SetService(gone, nil, nil)
	changedSvc := types.NamespacedName{Namespace: "ns3", Name: "svc3"}
	sp := *ns.PortsOf(changedSvc)[0]
	sp.ClusterEndpoints = sp.ClusterEndpoints[:1]
	ns.SetService(changedSvc, []*model.ServicePort{&sp}, nil)

	p := k.plan(ns, model.Changes{Full: true})
	s := &fakeSender{badSets: map[string]bool{set: true}}
	res := (&applier{c: s, f: ipv4, limits: defaultBatchLimits}).apply(p)
	if res.err == nil || !res.cleanupFailed || !strings.Contains(res.err.Error(), "removing leftovers rejected: delete elements from "+set) {
		t.Fatalf("err = %v, cleanupFailed = %v", res.err, res.cleanupFailed)
	}
	if len(res.failed) > 0 {
		t.Errorf("failed Services: %v", res.failed)
	}
	for i, g := range p.groups {
		if !g.cleanup && !g.applied {
			t.Errorf("group %d (%v) not applied", i, g.service)
		}
	}
}

func TestApplierChunksAtServiceBoundaries(t *testing.T) {
	k := newFakeKernel(testConfig(model.IPv4))
	p := k.plan(scaleState(model.IPv4, 200, 10), model.Changes{Full: true})
	s := &fakeSender{}
	res := (&applier{c: s, f: ipv4, limits: batchLimits{bytes: 16 << 10, messages: 100}}).apply(p)
	if res.err != nil || len(res.failed) > 0 {
		t.Fatalf("%v %v", res.err, res.failed)
	}
	if len(s.batches) < 10 {
		t.Fatalf("%d batches for 200 Services with 16 KiB batches", len(s.batches))
	}
	// A Service's chains are never split across batches.
	seen := map[string]int{}
	for i, b := range s.batches {
		for _, ch := range b {
			if j, ok := seen[ch]; ok && j != i {
				t.Fatalf("chain %s written by batches %d and %d", ch, j, i)
			}
			seen[ch] = i
		}
	}
}
