package app

// Conventions: node "node-a"; Services in namespace "ns" get ClusterIPs in 172.30.0.0/16
// and endpoints in 10.0.0.0/8. These tests need no root: requests are built in-process
// (the peer and local addresses set by hand); servers_kernel_test.go checks the same rules
// with real sockets across network namespaces.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/recording"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
)

const testNodeName = "node-a"

// mapSource is the test's model.Source.
type mapSource struct{ *modeltest.Source }

func newMapSource() *mapSource { return &mapSource{modeltest.NewSource()} }

// add stores Service number i of namespace ns (ClusterIP 172.30.x.y, port 80) with one
// slice of endpoints ready endpoints, and tells the tracker.
func (s *mapSource) add(tr *model.Tracker, ns string, i, endpoints int) {
	svc, slice := testService(ns, i, endpoints)
	s.Put(svc, slice)
	tr.OnServiceAdd(svc)
	tr.OnEndpointSliceAdd(slice)
}

func testService(ns string, i, endpoints int) (*v1.Service, *discoveryv1.EndpointSlice) {
	name := fmt.Sprintf("svc-%d", i)
	ip := netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)}).String()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	for j := range endpoints {
		k := i*endpoints + j
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName:   ptr.To([]string{"node-a", "node-b", "node-c"}[k%3]),
		})
	}
	return svc, slice
}

// testServers returns the servers of a node with a tracker over src and a sync loop
// with the recording backend (IPv4), not yet running.
func testServers(t testing.TB, src *mapSource, metricsAddr string, profiling bool) (*servers, *model.Tracker, *syncloop.Loop) {
	t.Helper()
	families := []model.IPFamily{model.IPv4}
	var loop *syncloop.Loop
	tr := model.NewTracker(model.TrackerConfig{
		Source:  src,
		Node:    model.NodeInfo{Name: testNodeName, IPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
		Options: model.Options{Families: families},
		Notify:  func() { loop.Request() },
	})
	loop, err := syncloop.New(syncloop.Config{
		Tracker:         tr,
		Backends:        []dataplane.Backend{recording.New(model.IPv4)},
		MinSyncPeriod:   10 * time.Millisecond,
		SyncPeriod:      time.Minute,
		MaxSyncInterval: time.Hour,
		Clock:           clock.RealClock{},
	})
	if err != nil {
		t.Fatal(err)
	}
	o := &config.Options{
		Config: &v1alpha1.KubeProxyConfiguration{Mode: "nftables", MetricsBindAddress: metricsAddr, EnableProfiling: profiling},
		Effective: &config.Effective{
			Mode: dataplane.ModeNFTables, NodeName: testNodeName,
			MetricsBindAddress: metricsAddr, EnableProfiling: profiling,
		},
	}
	return &servers{options: o, mode: dataplane.ModeRecording, tracker: tr, loop: loop, families: families}, tr, loop
}

// serveAs sends a GET for path to h as if it came from peer to local (both "IP:port").
func serveAs(h http.Handler, peer, local, path string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = peer
	req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(local))))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestOverLoopback(t *testing.T) {
	for _, tc := range []struct {
		name, peer, local string
		want              bool
	}{
		{"IPv4 loopback", "127.0.0.1:40000", "127.0.0.1:10249", true},
		{"another IPv4 loopback address", "127.0.0.5:40000", "127.0.0.1:10249", true},
		{"IPv6 loopback", "[::1]:40000", "[::1]:10249", true},
		{"IPv4 loopback on a dual-stack listener", "[::ffff:127.0.0.1]:40000", "[::ffff:127.0.0.1]:10249", true},
		{"a neighbour", "192.0.2.2:40000", "192.0.2.1:10249", false},
		{"the node itself through its own address", "192.0.2.1:40000", "192.0.2.1:10249", false},
		{"a neighbour routing to 127.0.0.1 (route_localnet)", "192.0.2.2:40000", "127.0.0.1:10249", false},
		{"a spoofed loopback source to the node's address", "127.0.0.1:40000", "192.0.2.1:10249", false},
		{"IPv6 neighbour", "[fd00::2]:40000", "[fd00::1]:10249", false},
		{"IPv6 link-local neighbour with a zone", "[fe80::2%eth0]:40000", "[fe80::1%eth0]:10249", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, StatePath, nil)
			req.RemoteAddr = tc.peer
			local := netip.MustParseAddrPort(tc.local)
			req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: local.Addr().AsSlice(), Port: int(local.Port()), Zone: local.Addr().Zone()}))
			if got := overLoopback(req); got != tc.want {
				t.Errorf("overLoopback(peer %s, local %s) = %v, want %v", tc.peer, tc.local, got, tc.want)
			}
		})
	}
	t.Run("no local address", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodGet, StatePath, nil)
		req.RemoteAddr = "127.0.0.1:40000"
		if overLoopback(req) {
			t.Error("a request without a local address counts as loopback")
		}
	})
}

func TestLoopbackTwin(t *testing.T) {
	for addr, want := range map[string]string{
		"0.0.0.0:10249":     "",
		"[::]:10249":        "",
		"127.0.0.1:10249":   "",
		"127.0.0.2:10249":   "",
		"[::1]:10249":       "",
		"192.0.2.1:10249":   "127.0.0.1:10249",
		"[fd00::1]:9000":    "127.0.0.1:9000",
		"010.000.0.1:10249": "127.0.0.1:10249", // upstream's sloppy IPv4 parsing
		"not-an-address":    "",
	} {
		if got := loopbackTwin(addr); got != want {
			t.Errorf("loopbackTwin(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestMetricsHandlerPages checks what every page answers a neighbour and a loopback
// client, and upstream's headers.
func TestMetricsHandlerPages(t *testing.T) {
	const (
		neighbour = "192.0.2.2:40000"
		nodeAddr  = "192.0.2.1:10249"
		loopback  = "127.0.0.1:40000"
		loAddr    = "127.0.0.1:10249"
	)
	type page struct {
		path     string
		code     int    // for a loopback client; a neighbour gets the same unless debug
		debug    bool   // a neighbour gets 403
		contains string // in the loopback answer's body
		nosniff  bool
	}
	for _, profiling := range []bool{false, true} {
		t.Run(fmt.Sprintf("enableProfiling=%v", profiling), func(t *testing.T) {
			s, _, _ := testServers(t, newMapSource(), nodeAddr, profiling)
			h := s.metricsHandler()
			pprofCode := http.StatusNotFound
			if profiling {
				pprofCode = http.StatusOK
			}
			for _, p := range []page{
				{path: "/metrics", code: 200}, // the registry is empty here: metrics.Register is not called
				{path: "/healthz", code: 200, contains: "ok", nosniff: true},
				{path: "/healthz?verbose", code: 200, contains: "[+]ping ok", nosniff: true},
				{path: "/healthz/ping", code: 200, contains: "ok", nosniff: true},
				{path: "/proxyMode", code: 200, contains: "nftables", nosniff: true},
				{path: "/configz", code: 200, contains: `"kubeproxy.config.k8s.io"`, nosniff: true},
				{path: StatePath, code: 200, debug: true, contains: `"schema": "` + StatusReportSchema + `"`, nosniff: true},
				{path: "/debug/pprof/", code: pprofCode, debug: true},
				{path: "/debug/pprof/cmdline", code: pprofCode, debug: true},
				{path: "/debug/other", code: 404, debug: true},
			} {
				rec := serveAs(h, loopback, loAddr, p.path)
				if rec.Code != p.code {
					t.Errorf("loopback GET %s: %d, want %d", p.path, rec.Code, p.code)
				}
				if p.code == 200 && !strings.Contains(rec.Body.String(), p.contains) {
					t.Errorf("loopback GET %s: body lacks %q:\n%.300s", p.path, p.contains, rec.Body.String())
				}
				if p.nosniff && rec.Header().Get("X-Content-Type-Options") != "nosniff" {
					t.Errorf("loopback GET %s: no X-Content-Type-Options: nosniff (headers %v)", p.path, rec.Header())
				}
				rec = serveAs(h, neighbour, nodeAddr, p.path)
				want := p.code
				if p.debug {
					want = http.StatusForbidden
				}
				if rec.Code != want {
					t.Errorf("neighbour GET %s: %d, want %d", p.path, rec.Code, want)
				}
				if p.debug && strings.Contains(rec.Body.String(), "schema") {
					t.Errorf("neighbour GET %s: the refusal carries the report", p.path)
				}
				if p.debug && !strings.Contains(rec.Body.String(), "loopback") {
					t.Errorf("neighbour GET %s: the refusal does not say why: %q", p.path, rec.Body.String())
				}
			}
		})
	}
}

// TestStatePageFollowsSyncs runs the sync loop: the page shows each Service once a sync
// programmed it, and is not rebuilt while nothing synced.
func TestStatePageFollowsSyncs(t *testing.T) {
	src := newMapSource()
	s, tr, loop := testServers(t, src, "127.0.0.1:10249", false)
	var builds atomic.Int32
	encode := s.encodeReportHead
	cache := newStateCache(loop.Status, func(st []syncloop.FamilyStatus) ([]byte, error) {
		builds.Add(1)
		return encode(st)
	}, s.reportTail, clock.RealClock{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- loop.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("loop.Run: %v", err)
		}
	})

	src.add(tr, "ns", 1, 2)
	tr.OnServicesSynced()
	tr.OnEndpointSlicesSynced()
	loop.Request()
	page := func() StatusReport {
		rec := httptest.NewRecorder()
		cache.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, StatePath, nil))
		var r StatusReport
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
			t.Fatalf("decoding %q: %v", rec.Body.String(), err)
		}
		return r
	}
	waitForServices := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			r := page()
			if len(r.Families) == 1 && len(r.Families[0].State.Services) == n && r.Families[0].Status.Syncs > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the page never showed %d Services: %+v", n, r.Families)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitForServices(1)
	src.add(tr, "ns", 2, 2)
	waitForServices(2)

	// Nothing syncs now: many requests, no build (after stateMinAge, one look at the
	// status, which has not changed).
	time.Sleep(stateMinAge)
	page()
	before := builds.Load()
	for range 50 {
		page()
	}
	if got := builds.Load() - before; got != 0 {
		t.Errorf("50 requests without a sync built the report %d times, want 0", got)
	}
}

// TestStatePageIsTheReport: the cached head and the live tail make exactly the JSON of the
// whole report (with and without a conntrack table), so the split cannot change the page.
func TestStatePageIsTheReport(t *testing.T) {
	src := newMapSource()
	s, tr, loop := testServers(t, src, "127.0.0.1:10249", false)
	src.add(tr, "ns", 1, 2)
	limit := uint64(262144)
	for _, ct := range []*conntrack.Status{
		nil,
		{Error: "netlink: permission denied"},
		{Stats: conntrack.Stats{Entries: 42, Limit: &limit, Counters: map[string]uint64{"drop": 1, "found": 7}, CPUs: 2}},
	} {
		status := loop.Status()
		head, err := s.encodeReportHead(status)
		if err != nil {
			t.Fatal(err)
		}
		tail, err := reportTailFor(ct)
		if err != nil {
			t.Fatal(err)
		}
		full := s.report(status)
		full.Conntrack = ct
		want, err := json.MarshalIndent(full, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if got := string(head) + string(tail); got != string(want)+"\n" {
			t.Errorf("conntrack %+v: the page is\n%s\nwant\n%s", ct, got, want)
		}
	}
}

func TestStateCacheBuildsOncePerSync(t *testing.T) {
	fake := testingclock.NewFakePassiveClock(time.Unix(1000, 0))
	status := []syncloop.FamilyStatus{{Family: "IPv4", Syncs: 1}}
	builds := 0
	c := newStateCache(func() []syncloop.FamilyStatus {
		// A copy, as the loop hands out.
		return []syncloop.FamilyStatus{status[0]}
	}, func(st []syncloop.FamilyStatus) ([]byte, error) {
		builds++
		return []byte(fmt.Sprintf("syncs=%d build=%d", st[0].Syncs, builds)), nil
	}, nil, fake)
	get := func() string {
		b, err := c.get()
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	steps := []struct {
		what    string
		advance time.Duration
		syncs   int
		want    string
	}{
		{"first request builds", 0, 1, "syncs=1 build=1"},
		{"a sync ended, but within stateMinAge of the build", stateMinAge / 2, 2, "syncs=1 build=1"},
		{"after stateMinAge", stateMinAge / 2, 2, "syncs=2 build=2"},
		{"no sync since", 5 * time.Second, 2, "syncs=2 build=2"},
		{"still no sync, just within stateMaxAge", stateMaxAge - 5*time.Second - time.Millisecond, 2, "syncs=2 build=2"},
		{"no sync, but stateMaxAge passed", time.Millisecond, 2, "syncs=2 build=3"},
	}
	for _, st := range steps {
		fake.SetTime(fake.Now().Add(st.advance))
		status[0].Syncs = st.syncs
		if got := get(); got != st.want {
			t.Errorf("%s: got %q, want %q", st.what, got, st.want)
		}
	}

	// Idle: the body is dropped (its timer runs on the real clock; call it at once).
	c.dropIfIdle() // just used: kept
	if c.body == nil {
		t.Error("a body in use was dropped")
	}
	fake.SetTime(fake.Now().Add(stateMaxAge))
	c.dropIfIdle()
	if c.body != nil {
		t.Error("a body nobody asked for during stateMaxAge was kept")
	}
	if got := get(); got != "syncs=2 build=4" {
		t.Errorf("after the drop: got %q, want a new build", got)
	}
	c.release.Stop()
}

func TestLimitConcurrency(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	h := limitConcurrency(2, 100*time.Millisecond, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "done")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func() (int, string) {
		resp, err := http.Get(srv.URL)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	results := make(chan int, 2)
	for range 2 {
		go func() { code, _ := get(); results <- code }()
	}
	<-entered
	<-entered
	code, retry := get()
	if code != http.StatusTooManyRequests || retry == "" {
		t.Errorf("third concurrent request: %d (Retry-After %q), want 429 with Retry-After", code, retry)
	}
	close(release)
	for range 2 {
		if code := <-results; code != http.StatusOK {
			t.Errorf("a request within the cap: %d", code)
		}
	}
	if code, _ := get(); code != http.StatusOK {
		t.Errorf("a request after the others ended: %d", code)
	}
}

// BenchmarkStatePage measures what a request of the state page costs at 10 000 Services
// (10 endpoints each, one family): "build" is what every request cost before the cache
// (copying the tracker's state, the view, the JSON), "cached" what a request costs while no
// sync has ended since the last build (a look at the sync loop's status). Report the ratio.
func BenchmarkStatePage(b *testing.B) {
	const services = 10000
	src := newMapSource()
	s, tr, loop := testServers(b, src, "127.0.0.1:10249", false)
	for i := range services {
		src.add(tr, "ns", i, 10)
	}
	tr.OnServicesSynced()
	tr.OnEndpointSlicesSynced()
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() { done <- loop.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("loop.Run: %v", err)
		}
	}()
	loop.Request()
	deadline := time.Now().Add(time.Minute)
	for {
		if st := loop.Status(); len(st) == 1 && st[0].Syncs > 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("no sync within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	head, err := s.encodeReportHead(loop.Status())
	if err != nil {
		b.Fatal(err)
	}
	tail, err := s.reportTail()
	if err != nil {
		b.Fatal(err)
	}
	body := append(head, tail...)
	var r StatusReport
	if err := json.Unmarshal(body, &r); err != nil || len(r.Families[0].State.Services) != services {
		b.Fatalf("the report has %d Service ports (err %v), want %d", len(r.Families[0].State.Services), err, services)
	}
	b.Logf("report: %d bytes", len(body))

	b.Run("build", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.encodeReportHead(loop.Status()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		cache := newStateCache(loop.Status, s.encodeReportHead, s.reportTail, clock.RealClock{})
		if _, err := cache.get(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(stateMinAge) // past the minimum age: every request compares the status
		b.ReportAllocs()
		for b.Loop() {
			if _, err := cache.get(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
