package main

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPlanOrdersSizesAndPlacesEveryRun(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range o.plan() {
		var runs []string
		for _, r := range p.runs {
			runs = append(runs, r.String())
		}
		if p.churn {
			runs = append(runs, "churn")
		}
		got = append(got, strings.Join(runs, " "))
	}
	nft := "sluice/nftables kube-proxy/nftables"
	want := []string{nft, nft,
		nft + " sluice/iptables-legacy kube-proxy/iptables-legacy sluice/iptables-nft churn",
		nft}
	if !slices.Equal(got, want) {
		t.Errorf("plan = %q, want %q", got, want)
	}
}

func TestParseChurnRuns(t *testing.T) {
	got, err := parseChurnRuns("sluice@shipped, kube-proxy@default,sluice@10ms")
	if err != nil {
		t.Fatal(err)
	}
	want := []churnRun{{proxySluice, minSyncShipped}, {proxyUpstream, minSyncDefault}, {proxySluice, "10ms"}}
	if !slices.Equal(got, want) {
		t.Errorf("runs = %v, want %v", got, want)
	}
	for _, bad := range []string{"sluice", "cilium@1s", "sluice@soon", "sluice@-1s", "sluice@0s"} {
		if _, err := parseChurnRuns(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func TestShippedConfigIsReadable(t *testing.T) {
	// The churn runs read the configuration sluice ships: it must stay readable here.
	sc, err := readShippedConfig("../../deploy/base/config.conf")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Mode != "nftables" {
		t.Errorf("mode = %q", sc.Mode)
	}
	if _, err := time.ParseDuration(sc.MinSyncPeriod); err != nil {
		t.Errorf("minSyncPeriod %q: %v", sc.MinSyncPeriod, err)
	}
	if _, err := parseShippedConfig("x", []byte("mode: nftables\nnftables:\n  syncPeriod: 30s\n")); err == nil {
		t.Error("a configuration without minSyncPeriod was accepted")
	}
	if _, err := parseShippedConfig("x", []byte("mode: ipvs\n")); err == nil {
		t.Error("an ipvs configuration was accepted")
	}
}

func TestChurnIsTheSameForEveryProxy(t *testing.T) {
	pick := func() []churnChange {
		rng, _ := phaseSeeds(7, 20)
		s := &churnState{extra: map[int]bool{}}
		return append(s.pick(rng, 10000, 50), s.pick(rng, 10000, 50)...)
	}
	a, b := pick(), pick()
	if !slices.Equal(a, b) {
		t.Error("the same seed and rate gave different changes")
	}
	other, _ := phaseSeeds(7, 100)
	if slices.Equal(a[:50], (&churnState{extra: map[int]bool{}}).pick(other, 10000, 50)) {
		t.Error("two rates gave the same changes")
	}
	// A Service picked twice loses the endpoint it gained.
	s := &churnState{extra: map[int]bool{}}
	fixed := rand.New(rand.NewPCG(1, 1))
	changes := s.pick(fixed, 1, 3)
	if !changes[0].extra || changes[1].extra || !changes[2].extra {
		t.Errorf("toggles = %+v", changes)
	}
}

func TestChurnAddressesStayApart(t *testing.T) {
	extra := netip.MustParsePrefix("100.96.0.0/12")
	lastOfDataset := fakeEndpoint(0, 1<<21-1, 1)
	for _, i := range []int{0, 1, 49999, 1<<20 - 2} {
		a := extraEndpoint(i)
		if !extra.Contains(a) || a.Compare(lastOfDataset) <= 0 || a.Compare(movedEndpoint(1000)) >= 0 {
			t.Errorf("extra endpoint of %d = %s: not in %s between the dataset and the moved endpoints", i, a, extra)
		}
	}
	if extraEndpoint(1) == extraEndpoint(2) {
		t.Error("two Services share an extra endpoint")
	}
}

func TestSummariseFlip(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	answers := []answer{
		{start: at(-2), answered: at(-1), pod: "a1"},
		{start: at(0), answered: at(1), pod: "a1"},
		{start: at(6), answered: at(9), pod: "a2"}, // answered after a later one
		{start: at(8), answered: at(8), pod: "a2"},
		{start: at(10), pod: ""},
		{start: at(12), answered: at(13), pod: "a1"}, // stale
	}
	res := flipProbeResult{Update: t0}
	if err := summariseFlip(&res, answers, "a2", "a1"); err != nil {
		t.Fatal(err)
	}
	if !res.FirstNew.Equal(at(6)) || !res.FirstNewAnswered.Equal(at(9)) || res.Stale != 1 || res.Unanswered != 1 {
		t.Errorf("flip = %+v", res)
	}
	early := flipProbeResult{Update: at(7)}
	if err := summariseFlip(&early, answers, "a2", "a1"); err == nil {
		t.Error("an answer from the new pod before the update was accepted")
	}
}

func TestAgreementWithinBuckets(t *testing.T) {
	h := histogramBuckets{Count: 4, Sum: 0.1, Buckets: []bucket{{0.25, 4}, {0.5, 4}, {1, 4}}}
	a := agreement(h, []float64{0.02, 0.02, 0.03, 0.03}, 0.005)
	if !a.Agrees || a.P50Bucket != [2]float64{0, 0.25} || a.Mean != 0.025 || a.Note != "" {
		t.Errorf("agreement = %+v", a)
	}
	// Upstream's default: flips around a second, one beyond 2s.
	h = histogramBuckets{Count: 4, Sum: 4.5, Buckets: []bucket{{0.25, 0}, {0.5, 0}, {1, 2}, {2, 3}, {3, 4}}}
	a = agreement(h, []float64{0.9, 0.95, 1.2, 2.5}, 0.005)
	if !a.Agrees || a.P50Bucket != [2]float64{0.5, 1} || a.P99Bucket != [2]float64{2, 3} {
		t.Errorf("agreement = %+v", a)
	}
	if a = agreement(h, []float64{0.1, 0.1, 0.1, 0.1}, 0.005); a.Agrees {
		t.Errorf("measured 100ms against a histogram around 1s agrees: %+v", a)
	}
	if got := quantileBucket(histogramBuckets{Count: 2, Buckets: []bucket{{0.25, 1}}}, 0.99); got[0] != 0.25 || !math.IsInf(got[1], 1) {
		t.Errorf("past the last bound: %v", got)
	}
}

func TestHistogramBuckets(t *testing.T) {
	read := func(count, low, high int) histogramBuckets {
		text := strings.NewReplacer("LOW", strconv.Itoa(low), "HIGH", strconv.Itoa(high), "COUNT", strconv.Itoa(count)).Replace(`
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"} LOW
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.5"} HIGH
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} COUNT
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="0.25"} 99
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 1.5
kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} COUNT
`)
		return parseMetrics(text).buckets(metricNetworkProgramming)
	}
	d := read(10, 6, 9).minus(read(4, 3, 4))
	want := histogramBuckets{Count: 6, Sum: 0, Buckets: []bucket{{0.25, 3}, {0.5, 5}}}
	if d.Count != want.Count || d.Sum != want.Sum || !slices.Equal(d.Buckets, want.Buckets) {
		t.Errorf("delta = %+v, want %+v", d, want)
	}
}

func TestSyncedAfterReadsKlogTimes(t *testing.T) {
	start := time.Date(2026, 12, 1, 21, 0, 0, 0, time.Local)
	log := `=== 2026-12-01T21:00:00Z: ip netns exec node sluice
I1201 21:00:00.500000    42 app.go:95] "Starting sluice"
I1201 21:00:02.250000    42 app.go:175] "Services and EndpointSlices received; programming"
I1201 21:00:01.100000    43 shared_informer.go:357] "Caches are synced" controller="endpoint slice config"
I1201 21:00:01.900000    43 shared_informer.go:357] "Caches are synced" controller="service config"
`
	got, err := syncedAfter(log, syncedMarkers[proxySluice], start)
	if err != nil || got != 2250*time.Millisecond {
		t.Errorf("sluice: %v, %v", got, err)
	}
	got, err = syncedAfter(log, syncedMarkers[proxyUpstream], start)
	if err != nil || got != 1900*time.Millisecond {
		t.Errorf("upstream (the later informer): %v, %v", got, err)
	}
	if _, err := syncedAfter("I1201 21:00:00.500000 1 x.go:1] other\n", syncedMarkers[proxySluice], start); err == nil {
		t.Error("a log without the marker gave a time")
	}
}

func TestOneChainRestore(t *testing.T) {
	saved := `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAA - [0:0]
:KUBE-SVC-BBB - [0:0]
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "scale/svc-00001:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAA
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "zz-scale-sentinel/sentinel:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-BBB
-A KUBE-SVC-AAA -j KUBE-SEP-1
-A KUBE-SVC-BBB ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SVC-BBB -j KUBE-SEP-2
COMMIT
`
	chain, input, err := oneChainRestore(saved, "zz-scale-sentinel/sentinel:")
	if err != nil {
		t.Fatal(err)
	}
	want := "*nat\n:KUBE-SVC-BBB - [0:0]\n-A KUBE-SVC-BBB ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ\n-A KUBE-SVC-BBB -j KUBE-SEP-2\nCOMMIT\n"
	if chain != "KUBE-SVC-BBB" || input != want {
		t.Errorf("chain %q, input:\n%s", chain, input)
	}
	if _, _, err := oneChainRestore(saved, "other/x:"); err == nil {
		t.Error("a Service without a rule gave a chain")
	}
}

func TestProxyConfigSetsPeriodsInBothSections(t *testing.T) {
	cfg := proxyConfig(proxySettings{Mode: "nftables", Node: "n", Kubeconfig: "k", SyncPeriod: "30s", MinSyncPeriod: "10ms"})
	for _, want := range []string{"iptables:\n  syncPeriod: 30s\n  minSyncPeriod: 10ms\n", "nftables:\n  syncPeriod: 30s\n  minSyncPeriod: 10ms\n", "mode: nftables\n"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("configuration lacks %q:\n%s", want, cfg)
		}
	}
	if cfg := proxyConfig(proxySettings{Mode: "iptables"}); strings.Contains(cfg, "SyncPeriod") {
		t.Errorf("default periods written:\n%s", cfg)
	}
}

func TestClusterIPsStayInTheRangeAndApart(t *testing.T) {
	c := clusterIPs{base: netip.MustParsePrefix("10.96.0.0/16")}
	seen := map[netip.Addr]string{netip.MustParseAddr("10.96.0.1"): "kubernetes"}
	add := func(what string, a netip.Addr) {
		t.Helper()
		if !c.base.Contains(a) || a == c.base.Addr() {
			t.Fatalf("%s = %s, not a host of %s", what, a, c.base)
		}
		if other, ok := seen[a]; ok {
			t.Fatalf("%s and %s share %s", what, other, a)
		}
		seen[a] = what
	}
	add("sentinel", c.sentinel())
	for k := range maxProbes {
		add(probeName(k), c.probe(k))
	}
	for i := range c.maxBulk() {
		add(bulkName(i), c.bulk(i))
	}
	if last := c.bulk(c.maxBulk() - 1); last != netip.MustParseAddr("10.96.255.254") {
		t.Errorf("last bulk ClusterIP = %s", last)
	}
}
