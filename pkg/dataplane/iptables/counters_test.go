package iptables

import "testing"

func TestParseCounterLines(t *testing.T) {
	listed := []struct {
		line string
		want ruleCount
		ok   bool
	}{
		{`-A KUBE-SVC-X -m comment --comment "ns/web:http traffic counter" -c 7 420`, ruleCount{7, 420}, true},
		{`-A KUBE-SVC-X -m comment --comment "ns/web:http traffic counter" -c 18446744073709551615 1`, ruleCount{1<<64 - 1, 1}, true},
		{`-A KUBE-SVC-X -m comment --comment "ns/web:http cluster IP" -c 7 420 -j KUBE-MARK-MASQ`, ruleCount{}, false},
		{`-A KUBE-SVC-X -m comment --comment "ns/web:http traffic counter"`, ruleCount{}, false},
		{``, ruleCount{}, false},
	}
	for _, tc := range listed {
		if got, ok := parseListedCounter(tc.line); ok != tc.ok || got != tc.want {
			t.Errorf("parseListedCounter(%q) = %v, %v; want %v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
	saved := []struct {
		line  string
		chain string
		want  ruleCount
		ok    bool
	}{
		{`[7:420] -A KUBE-EXT-X -m comment --comment "ns/web:http traffic counter"`, "KUBE-EXT-X", ruleCount{7, 420}, true},
		{`[7:420] -A KUBE-EXT-X -m comment --comment "ns/web:http traffic counter" -j DROP`, "", ruleCount{}, false},
		{`[0:0] -A KUBE-SVC-X -j KUBE-SEP-Y`, "", ruleCount{}, false},
		{`:KUBE-SVC-X - [0:0]`, "", ruleCount{}, false},
		{`[x:1] -A KUBE-EXT-X -m comment --comment "ns/web:http traffic counter"`, "KUBE-EXT-X", ruleCount{0, 1}, false},
	}
	for _, tc := range saved {
		chain, got, ok := parseSavedCounter(tc.line)
		if ok != tc.ok || (ok && (chain != tc.chain || got != tc.want)) {
			t.Errorf("parseSavedCounter(%q) = %q, %v, %v; want %q, %v, %v", tc.line, chain, got, ok, tc.chain, tc.want, tc.ok)
		}
	}
}

// TestCarriedCountsPrefixTheCounterRuleOnly: a carried count is written before the
// counter rule, as iptables-restore --counters reads it, and nowhere else.
func TestCarriedCountsPrefixTheCounterRuleOnly(t *testing.T) {
	c := &chainRules{name: "KUBE-SVC-X", rules: []string{
		`-A KUBE-SVC-X -m comment --comment "ns/web:http traffic counter"`,
		`-A KUBE-SVC-X -j KUBE-SEP-Y`,
	}}
	s := &serviceRules{carry: map[string]ruleCount{"KUBE-SVC-X": {5, 300}}}
	if got, want := s.ruleLine(c, 0), `[5:300] `+c.rules[0]; got != want {
		t.Errorf("counter rule: %q, want %q", got, want)
	}
	if got := s.ruleLine(c, 1); got != c.rules[1] {
		t.Errorf("other rule: %q", got)
	}
	uncounted := &chainRules{name: "KUBE-SVC-X", rules: []string{`-A KUBE-SVC-X -j KUBE-SEP-Y`}}
	if got := s.ruleLine(uncounted, 0); got != uncounted.rules[0] {
		t.Errorf("a chain without a counter rule got counts: %q", got)
	}
}

// TestRestartFold: a counter the kernel restarts after a carry it ignored keeps counting
// from the carried value; one whose carry worked is not counted twice; chains no longer
// counted are forgotten.
func TestRestartFold(t *testing.T) {
	var f restartFold
	read := func(v uint64, carried bool, keep ...string) uint64 {
		t.Helper()
		return f.fold(map[string]ruleCount{"c": {packets: v, bytes: 10 * v}}, keep, carried)["c"].packets
	}
	steps := []struct {
		name    string
		kernel  uint64
		carried bool
		want    uint64
	}{
		{"first read", 8, false, 8},
		{"read before a rewrite, carried", 8, true, 8},
		{"the restore ignored the carry: restarted", 0, false, 8},
		{"counting on", 3, false, 11},
		{"read before another rewrite", 4, true, 12},
		{"this restore took the carry", 12, false, 12},
		{"counting on", 15, false, 15},
	}
	for _, s := range steps {
		if got := read(s.kernel, s.carried, "c"); got != s.want {
			t.Fatalf("%s: kernel %d reads %d, want %d", s.name, s.kernel, got, s.want)
		}
	}
	f.fold(nil, []string{"other"}, false)
	if got := read(2, false); got != 2 {
		t.Errorf("a chain counted again after it was not: %d, want 2 (nothing folded)", got)
	}
}
