package nftables

import "testing"

// TestGenWatch: the foreign count moves whenever the generation moved by anything but
// one commit of ours, and only then.
func TestGenWatch(t *testing.T) {
	type step struct {
		kind          string // "observe", "commit", "reject", "doubt"
		before, after uint32
	}
	for _, tc := range []struct {
		name        string
		steps       []step
		wantForeign uint64
	}{
		{name: "first sight is not trusted", steps: []step{{kind: "observe", after: 7}}, wantForeign: 1},
		{name: "same generation again", steps: []step{{kind: "observe", after: 7}, {kind: "observe", after: 7}}, wantForeign: 1},
		{name: "our commits", steps: []step{{kind: "observe", after: 7}, {kind: "commit", before: 7, after: 8}, {kind: "commit", before: 8, after: 9}, {kind: "observe", after: 9}}, wantForeign: 1},
		{name: "a rejected batch leaves the generation", steps: []step{{kind: "observe", after: 7}, {kind: "reject", before: 7, after: 7}, {kind: "observe", after: 7}}, wantForeign: 1},
		{name: "someone committed between our commits", steps: []step{{kind: "observe", after: 7}, {kind: "commit", before: 7, after: 8}, {kind: "commit", before: 9, after: 10}}, wantForeign: 2},
		{name: "someone committed together with us", steps: []step{{kind: "observe", after: 7}, {kind: "commit", before: 7, after: 9}}, wantForeign: 2},
		{name: "someone committed after us", steps: []step{{kind: "observe", after: 7}, {kind: "commit", before: 7, after: 8}, {kind: "observe", after: 9}}, wantForeign: 2},
		{name: "a rejected batch that moved the generation", steps: []step{{kind: "observe", after: 7}, {kind: "reject", before: 7, after: 8}}, wantForeign: 2},
		{name: "a lost answer, then the same generation", steps: []step{{kind: "observe", after: 7}, {kind: "doubt"}, {kind: "observe", after: 7}}, wantForeign: 3},
		{name: "wrap-around", steps: []step{{kind: "observe", after: ^uint32(0)}, {kind: "commit", before: ^uint32(0), after: 1}}, wantForeign: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w genWatch
			for _, s := range tc.steps {
				switch s.kind {
				case "observe":
					w.observe(s.after)
				case "commit":
					w.committed(s.before, s.after, true)
				case "reject":
					w.committed(s.before, s.after, false)
				case "doubt":
					w.doubt()
				}
			}
			if w.foreign != tc.wantForeign {
				t.Fatalf("foreign = %d, want %d", w.foreign, tc.wantForeign)
			}
		})
	}
}

// TestGenWatchPerNamespace: conns of one namespace share a watch; an unknown namespace
// gets a private one.
func TestGenWatchPerNamespace(t *testing.T) {
	first, again, other := genWatchFor(42), genWatchFor(42), genWatchFor(43)
	if first != again || first == other {
		t.Fatal("watches are not one per namespace")
	}
	if a, b := genWatchFor(0), genWatchFor(0); a == b {
		t.Fatal("an unknown namespace shares its watch")
	}
}
