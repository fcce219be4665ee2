package iptables

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestRuleCountAndFailureMetrics(t *testing.T) {
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy)
	w := featureWorld()
	mustApply(t, b, w.state(model.IPv4), full())
	count := func(table string) int {
		n := 0
		for _, c := range k.chainNames(table, "KUBE-") {
			if c == chainCanary {
				continue
			}
			n += len(k.rules(table, c))
		}
		return n
	}
	for _, table := range []string{tableNAT, tableFilter} {
		if got, want := metricstest.Value(t, metrics.IPTablesRulesTotal.WithLabelValues(table, "IPv4")), float64(count(table)); got != want {
			t.Errorf("iptables_total{table=%s} = %v, want %v (rules in the kernel)", table, got, want)
		}
	}
	if got := metricstest.Value(t, metrics.IPTablesRulesLastSync.WithLabelValues(tableNAT, "IPv4")); got < 50 {
		t.Errorf("iptables_last{table=nat} = %v after a full sync", got)
	}

	failures := metricstest.Value(t, metrics.IPTablesRestoreFailuresTotal.WithLabelValues("IPv4"))
	partial := metricstest.Value(t, metrics.IPTablesPartialRestoreFailuresTotal.WithLabelValues("IPv4"))
	k.rejectAtCommit = func(_, _ string, r *fakeRule) bool { return strings.Contains(r.spec, "10.180.2.77") }
	w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).Endpoints("10.180.2.77:80").Build())
	res := b.Apply(context.Background(), w.state(model.IPv4), changed("ns1/svc1"))
	if len(res.Failed) != 1 {
		t.Fatalf("Failed = %v", res.Failed)
	}
	if got := metricstest.Value(t, metrics.IPTablesRestoreFailuresTotal.WithLabelValues("IPv4")); got <= failures {
		t.Errorf("restore failures not counted")
	}
	if got := metricstest.Value(t, metrics.IPTablesPartialRestoreFailuresTotal.WithLabelValues("IPv4")); got <= partial {
		t.Errorf("partial restore failures not counted")
	}
	if got, want := metricstest.Value(t, metrics.IPTablesRulesTotal.WithLabelValues(tableNAT, "IPv4")), float64(count(tableNAT)); got != want {
		t.Errorf("after a partial sync iptables_total{table=nat} = %v, want %v", got, want)
	}
}

// scriptedNFAcct is a kernel with nfacct.
type scriptedNFAcct map[string]uint64

func (s scriptedNFAcct) Ensure(name string) error { s[name] += 0; return nil }
func (s scriptedNFAcct) Packets(name string) (uint64, error) {
	v, ok := s[name]
	if !ok {
		return 0, fmt.Errorf("no counter %s", name)
	}
	return v, nil
}

func TestNFAcctCountersWhenTheKernelHasThem(t *testing.T) {
	acct := scriptedNFAcct{}
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy, withNFAcct(acct))
	mustApply(t, b, featureWorld().state(model.IPv4), full())
	if _, ok := acct[nfacctInvalidDropped]; !ok {
		t.Fatalf("counter %s not created", nfacctInvalidDropped)
	}
	var invalid, localhost bool
	for _, r := range k.rules(tableFilter, chainForward) {
		invalid = invalid || strings.Contains(r, "--nfacct-name "+nfacctInvalidDropped)
	}
	for _, r := range k.rules(tableNAT, chainNodePorts) {
		localhost = localhost || strings.Contains(r, "-d 127.0.0.0/8") && strings.Contains(r, "--nfacct-name "+nfacctLocalhostAccept)
	}
	if !invalid || !localhost {
		t.Errorf("nfacct matches missing: INVALID drop %v, localhost NodePort %v", invalid, localhost)
	}
	acct[nfacctInvalidDropped] = 7
	acct[nfacctLocalhostAccept] = 3
	families := metricstest.Collect(t, &nfacctCollector{client: acct, localhostNodePorts: true})
	got := map[string]float64{}
	for _, f := range families {
		got[f.GetName()] = f.GetMetric()[0].GetCounter().GetValue()
	}
	want := map[string]float64{
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":     7,
		"kubeproxy_iptables_localhost_nodeports_accepted_packets_total": 3,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("nfacct metrics = %v, want %v", got, want)
	}

	// Without nfacct (this project's test kernel): no match in any rule.
	b2, k2, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy)
	mustApply(t, b2, featureWorld().state(model.IPv4), full())
	if strings.Contains(k2.save(""), "nfacct") {
		t.Errorf("nfacct match written without nfacct in the kernel")
	}
}
