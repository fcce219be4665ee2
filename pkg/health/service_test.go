package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/asynctest"
)

// Test conventions for the per-Service servers: healthCheckNodePorts are in 30000-30999.
// Most tests inject fakeListen, which records the address the server asked for but really
// listens on 127.0.0.1:0, so no test depends on a free well-known port; TestRealBind*
// bind real loopback ports.

var (
	svcA = types.NamespacedName{Namespace: "ns1", Name: "a"}
	svcB = types.NamespacedName{Namespace: "ns1", Name: "b"}
	svcC = types.NamespacedName{Namespace: "ns2", Name: "c"}
)

// fakeListen opens a real loopback listener for every requested address, and fails the
// addresses in fail.
type fakeListen struct {
	mu sync.Mutex
	// fail maps a requested "host:port" to the error to return for it.
	fail map[string]error
	// open maps a requested "host:port" to the listener serving it (the latest one).
	open map[string]*trackedListener
	// requests lists every requested "network host:port", in order.
	requests []string
}

type trackedListener struct {
	net.Listener
	closed atomic.Bool
}

func (l *trackedListener) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

func newFakeListen() *fakeListen {
	return &fakeListen{fail: map[string]error{}, open: map[string]*trackedListener{}}
}

func (f *fakeListen) listen(ctx context.Context, network, addr string) (net.Listener, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, network+" "+addr)
	if err := f.fail[addr]; err != nil {
		return nil, err
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	tl := &trackedListener{Listener: l}
	f.open[addr] = tl
	return tl, nil
}

func (f *fakeListen) listener(t *testing.T, addr string) *trackedListener {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.open[addr]
	if l == nil {
		t.Fatalf("nothing was opened for %s", addr)
	}
	return l
}

func (f *fakeListen) requestCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

type listenFailure struct {
	service types.NamespacedName
	port    int32
	err     error
}

type failureLog struct{ asynctest.Log[listenFailure] }

func (l *failureLog) record(service types.NamespacedName, port int32, err error) {
	l.Add(listenFailure{service, port, err})
}

func (l *failureLog) take() []listenFailure { return l.Take() }

func httpGet(t *testing.T, addr string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

func matchAll() dataplane.NodePortAddresses { return dataplane.NodePortAddresses{MatchAll: true} }

func TestServiceHealthResponses(t *testing.T) {
	fl := newFakeListen()
	var proxyHealthy atomic.Bool
	proxyHealthy.Store(true)
	s := newServiceHealthServer(t.Context(), ServiceHealthConfig{
		Family:            model.IPv4,
		NodePortAddresses: matchAll(),
		ProxyHealthy:      proxyHealthy.Load,
	}, nil, nil, fl.listen)
	defer s.Close()

	s.SyncServices(map[types.NamespacedName]int32{svcA: 30001})
	addr := fl.listener(t, "0.0.0.0:30001").Addr().String()

	body := func(count int, healthy bool) string {
		return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"a\"\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}", count, healthy)
	}
	for _, step := range []struct {
		name         string
		endpoints    map[types.NamespacedName]int
		proxyHealthy bool
		wantCode     int
		wantCount    int
	}{
		{name: "no endpoints reported yet", endpoints: nil, proxyHealthy: true, wantCode: 503, wantCount: 0},
		{name: "local ready endpoints", endpoints: map[types.NamespacedName]int{svcA: 2, svcB: 7}, proxyHealthy: true, wantCode: 200, wantCount: 2},
		{name: "local ready endpoints but proxy unhealthy", endpoints: map[types.NamespacedName]int{svcA: 2}, proxyHealthy: false, wantCode: 503, wantCount: 2},
		{name: "Service left out of the endpoint counts", endpoints: map[types.NamespacedName]int{svcB: 1}, proxyHealthy: true, wantCode: 503, wantCount: 0},
		{name: "zero local endpoints", endpoints: map[types.NamespacedName]int{svcA: 0}, proxyHealthy: true, wantCode: 503, wantCount: 0},
	} {
		t.Run(step.name, func(t *testing.T) {
			if step.endpoints != nil {
				s.SyncEndpoints(step.endpoints)
			}
			proxyHealthy.Store(step.proxyHealthy)
			code, hdr, got := httpGet(t, addr)
			if code != step.wantCode {
				t.Errorf("code %d, want %d", code, step.wantCode)
			}
			if w := hdr.Get(EndpointWeightHeader); w != strconv.Itoa(step.wantCount) {
				t.Errorf("%s = %q, want %d", EndpointWeightHeader, w, step.wantCount)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if want := body(step.wantCount, step.proxyHealthy); got != want {
				t.Errorf("body\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestSyncServicesOpensAndClosesListeners(t *testing.T) {
	fl := newFakeListen()
	s := newServiceHealthServer(t.Context(), ServiceHealthConfig{Family: model.IPv6, NodePortAddresses: matchAll()}, nil, nil, fl.listen)
	defer s.Close()

	s.SyncServices(map[types.NamespacedName]int32{svcA: 30001, svcB: 30002})
	if got, want := s.Ports(), map[types.NamespacedName]int32{svcA: 30001, svcB: 30002}; !maps.Equal(got, want) {
		t.Fatalf("Ports() = %v, want %v", got, want)
	}
	if want := []string{"tcp6 [::]:30001", "tcp6 [::]:30002"}; !slices.Equal(fl.requests, want) {
		t.Fatalf("listen requests %v, want %v", fl.requests, want)
	}
	a, b := fl.listener(t, "[::]:30001"), fl.listener(t, "[::]:30002")
	s.SyncEndpoints(map[types.NamespacedName]int{svcA: 1})

	// b moves to another port, c appears; a is left alone (no new listen, counts kept).
	s.SyncServices(map[types.NamespacedName]int32{svcA: 30001, svcB: 30003, svcC: 30004})
	if !b.closed.Load() {
		t.Error("b's old listener is still open after its port changed")
	}
	if a.closed.Load() {
		t.Error("a's listener was closed although a did not change")
	}
	if n := fl.requestCount(); n != 4 {
		t.Errorf("%d listen requests in total, want 4 (a must not be reopened)", n)
	}
	if code, _, _ := httpGet(t, a.Addr().String()); code != 200 {
		t.Errorf("a answers %d after an unrelated sync, want 200 (its endpoint count must survive)", code)
	}
	if code, _, _ := httpGet(t, fl.listener(t, "[::]:30003").Addr().String()); code != 503 {
		t.Errorf("b on its new port answers %d, want 503 (no endpoints)", code)
	}

	// Everything goes away.
	s.SyncServices(nil)
	if len(s.Ports()) != 0 {
		t.Errorf("Ports() = %v after removing every Service", s.Ports())
	}
	for _, addr := range []string{"[::]:30001", "[::]:30003", "[::]:30004"} {
		if !fl.listener(t, addr).closed.Load() {
			t.Errorf("listener for %s still open", addr)
		}
	}
	if _, err := net.DialTimeout("tcp", a.Addr().String(), time.Second); err == nil {
		t.Error("a's port still accepts connections after it was closed")
	}
}

func TestBindFailureIsIsolatedAndRetried(t *testing.T) {
	fl := newFakeListen()
	fl.fail["0.0.0.0:30002"] = syscall.EADDRINUSE
	var failures failureLog
	s := newServiceHealthServer(t.Context(), ServiceHealthConfig{
		Family: model.IPv4, NodePortAddresses: matchAll(), OnListenError: failures.record,
	}, nil, nil, fl.listen)
	defer s.Close()

	want := map[types.NamespacedName]int32{svcA: 30001, svcB: 30002, svcC: 30003}
	s.SyncServices(want)
	if got := s.Ports(); !maps.Equal(got, map[types.NamespacedName]int32{svcA: 30001, svcC: 30003}) {
		t.Errorf("Ports() = %v, want a and c open", got)
	}
	got := failures.take()
	if len(got) != 1 || got[0].service != svcB || got[0].port != 30002 || !errors.Is(got[0].err, syscall.EADDRINUSE) {
		t.Fatalf("OnListenError calls = %+v, want one for ns1/b port 30002 wrapping EADDRINUSE", got)
	}

	// The next sync tries again, and reports again while the port stays busy.
	s.SyncServices(want)
	if got := failures.take(); len(got) != 1 || got[0].service != svcB {
		t.Fatalf("second sync: OnListenError calls = %+v, want one for ns1/b", got)
	}
	fl.mu.Lock()
	delete(fl.fail, "0.0.0.0:30002")
	fl.mu.Unlock()
	s.SyncServices(want)
	if got := failures.take(); len(got) != 0 {
		t.Errorf("OnListenError calls after the port was freed: %+v", got)
	}
	if got := s.Ports(); !maps.Equal(got, want) {
		t.Errorf("Ports() = %v, want %v", got, want)
	}
}

func TestBindFailureOnOneAddressClosesTheOthers(t *testing.T) {
	fl := newFakeListen()
	fl.fail["192.0.2.2:30001"] = syscall.EADDRNOTAVAIL
	var failures failureLog
	host := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}
	s := newServiceHealthServer(t.Context(), ServiceHealthConfig{
		Family:            model.IPv4,
		NodePortAddresses: dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
		OnListenError:     failures.record,
	}, host, nil, fl.listen)
	defer s.Close()

	s.SyncServices(map[types.NamespacedName]int32{svcA: 30001})
	if !fl.listener(t, "192.0.2.1:30001").closed.Load() {
		t.Error("the listener on the first address was left open after the second failed")
	}
	if len(s.Ports()) != 0 {
		t.Errorf("Ports() = %v, want none", s.Ports())
	}
	if got := failures.take(); len(got) != 1 {
		t.Errorf("OnListenError calls = %+v, want 1", got)
	}
}

func TestOutOfRangePortIsReported(t *testing.T) {
	fl := newFakeListen()
	var failures failureLog
	s := newServiceHealthServer(t.Context(), ServiceHealthConfig{
		Family: model.IPv4, NodePortAddresses: matchAll(), OnListenError: failures.record,
	}, nil, nil, fl.listen)
	defer s.Close()
	s.SyncServices(map[types.NamespacedName]int32{svcA: 70000, svcB: 0})
	if got := failures.take(); len(got) != 2 {
		t.Errorf("OnListenError calls = %+v, want 2", got)
	}
	if fl.requestCount() != 0 {
		t.Errorf("listen was called for an invalid port: %v", fl.requests)
	}
}

func TestListenAddresses(t *testing.T) {
	host := []netip.Addr{
		netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.1.9"),
		netip.MustParseAddr("fd00::5"), netip.MustParseAddr("::1"), netip.MustParseAddr("10.0.0.5"),
		netip.MustParseAddr("::ffff:10.0.0.6"),
	}
	prefixes := func(s ...string) dataplane.NodePortAddresses {
		var n dataplane.NodePortAddresses
		for _, p := range s {
			n.CIDRs = append(n.CIDRs, netip.MustParsePrefix(p))
		}
		return n
	}
	for _, tc := range []struct {
		name        string
		family      model.IPFamily
		npa         dataplane.NodePortAddresses
		wantNetwork string
		want        []string
	}{
		{"match-all IPv4", model.IPv4, matchAll(), "tcp4", []string{"0.0.0.0"}},
		{"match-all IPv6", model.IPv6, matchAll(), "tcp6", []string{"::"}},
		{"primary IPv4", model.IPv4, prefixes("10.0.0.5/32"), "tcp4", []string{"10.0.0.5"}},
		{"CIDR and localhost", model.IPv4, prefixes("10.0.0.0/8", "127.0.0.0/8"), "tcp4", []string{"10.0.0.5", "10.0.0.6", "127.0.0.1"}},
		{"other family's CIDRs only", model.IPv6, prefixes("10.0.0.0/8"), "tcp6", nil},
		{"IPv6 CIDR", model.IPv6, prefixes("fd00::/64", "::1/128"), "tcp6", []string{"::1", "fd00::5"}},
		{"nothing matches", model.IPv4, prefixes("203.0.113.0/24"), "tcp4", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			network, addrs := listenAddresses(tc.family, tc.npa, host)
			var got []string
			for _, a := range addrs {
				got = append(got, a.String())
			}
			if network != tc.wantNetwork || !slices.Equal(got, tc.want) {
				t.Errorf("listenAddresses = %s %v, want %s %v", network, got, tc.wantNetwork, tc.want)
			}
		})
	}
}

func TestHostAddressErrorFallsBackToWildcard(t *testing.T) {
	s := newServiceHealthServer(t.Context(), ServiceHealthConfig{
		Family: model.IPv4, NodePortAddresses: dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
	}, nil, errors.New("no netlink"), newFakeListen().listen)
	if got := s.ListenAddresses(); !slices.Equal(got, []netip.Addr{netip.IPv4Unspecified()}) {
		t.Errorf("ListenAddresses() = %v, want [0.0.0.0]", got)
	}
}

func TestCancelledContextClosesEverything(t *testing.T) {
	fl := newFakeListen()
	ctx, cancel := context.WithCancel(t.Context())
	s := newServiceHealthServer(ctx, ServiceHealthConfig{Family: model.IPv4, NodePortAddresses: matchAll()}, nil, nil, fl.listen)
	s.SyncServices(map[types.NamespacedName]int32{svcA: 30001})
	l := fl.listener(t, "0.0.0.0:30001")
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for !l.closed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("listener still open after the context was cancelled")
		}
		time.Sleep(time.Millisecond)
	}
	s.SyncServices(map[types.NamespacedName]int32{svcB: 30002})
	if len(s.Ports()) != 0 || fl.requestCount() != 1 {
		t.Errorf("SyncServices opened ports after shutdown: %v", s.Ports())
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int32 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

func TestRealBindConflictDoesNotStopOtherServices(t *testing.T) {
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := int32(busy.Addr().(*net.TCPAddr).Port)
	freeP := freePort(t)

	var failures failureLog
	s := newServiceHealthServer(t.Context(), ServiceHealthConfig{
		Family:            model.IPv4,
		NodePortAddresses: dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}},
		ProxyHealthy:      func() bool { return true },
		OnListenError:     failures.record,
	}, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil, listenTCP)
	defer s.Close()

	s.SyncServices(map[types.NamespacedName]int32{svcA: busyPort, svcB: freeP})
	s.SyncEndpoints(map[types.NamespacedName]int{svcB: 3})
	got := failures.take()
	if len(got) != 1 || got[0].service != svcA || !errors.Is(got[0].err, syscall.EADDRINUSE) {
		t.Fatalf("OnListenError calls = %+v, want one for ns1/a with EADDRINUSE", got)
	}
	code, hdr, _ := httpGet(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(int(freeP))))
	if code != 200 || hdr.Get(EndpointWeightHeader) != "3" {
		t.Errorf("b answers %d with weight %q, want 200 and 3", code, hdr.Get(EndpointWeightHeader))
	}

	// Closing b releases its port at once, so it can be bound again.
	s.SyncServices(nil)
	l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(freeP))))
	if err != nil {
		t.Fatalf("port of a closed health check is not free: %v", err)
	}
	_ = l.Close()
}
