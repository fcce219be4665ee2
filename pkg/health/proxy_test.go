package health

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/asynctest"
)

// Test conventions: the node is "node-a"; the fake clock starts at t0 and the health
// timeout is 60 s (2 × the default syncPeriod of 30 s). Handlers are exercised through
// httptest recorders; only the Run tests open (loopback) sockets.

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

const timeout = 60 * time.Second

func readyNode() *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
}

func newTestProxyServer() (*ProxyHealthServer, *testingclock.FakeClock) {
	c := testingclock.NewFakeClock(t0)
	return newProxyHealthServer("127.0.0.1:0", timeout, c, listenTCP), c
}

func get(t *testing.T, h http.Handler, path string) (int, http.Header, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Header(), rec.Body.String()
}

func counter(t *testing.T, vec *prometheus.CounterVec, code string) float64 {
	t.Helper()
	return metricstest.Value(t, vec.WithLabelValues(code))
}

func TestProxyHealthResponses(t *testing.T) {
	deleting := readyNode()
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	tainted := readyNode()
	tainted.Spec.Taints = []v1.Taint{{Key: ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	otherTaint := readyNode()
	otherTaint.Spec.Taints = []v1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: v1.TaintEffectNoSchedule}}

	const (
		now  = `"2026-03-04T05:08:07Z"` // t0 + 2 min, when every request is made
		sync = `"2026-03-04T05:06:07Z"` // t0, when the syncs happen
	)

	for _, tc := range []struct {
		name string
		// setup runs at t0; requests are made 2 minutes later.
		setup       func(s *ProxyHealthServer)
		node        *v1.Node
		wantHealthz int
		wantLivez   int
		// wantHealthzBody is the exact /healthz body; /livez must be the same without
		// nodeEligible (and with its own healthy and lastUpdated).
		wantHealthzBody string
		wantLivezBody   string
	}{
		{
			name:            "nothing reported yet",
			setup:           func(*ProxyHealthServer) {},
			node:            readyNode(),
			wantHealthz:     200,
			wantLivez:       200,
			wantHealthzBody: `{"lastUpdated":` + now + `,"currentTime":` + now + `,"nodeEligible":true,"healthy":true}`,
			wantLivezBody:   `{"lastUpdated":` + now + `,"currentTime":` + now + `,"healthy":true}`,
		},
		{
			// The health server runs from sluice's first second, before the Node is read
			// and before any sync, as upstream's answers without a Node: alive, not ready.
			name:            "at start: no Node read, nothing synced",
			setup:           func(*ProxyHealthServer) {},
			node:            nil,
			wantHealthz:     503,
			wantLivez:       200,
			wantHealthzBody: `{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":` + now + `,"nodeEligible":false,"healthy":false}`,
			wantLivezBody:   `{"lastUpdated":` + now + `,"currentTime":` + now + `,"healthy":true}`,
		},
		{
			name:            "synced and nothing queued since",
			setup:           func(s *ProxyHealthServer) { s.QueuedUpdate(model.IPv4); s.Updated(model.IPv4) },
			node:            readyNode(),
			wantHealthz:     200,
			wantLivez:       200,
			wantHealthzBody: `{"lastUpdated":` + now + `,"currentTime":` + now + `,"nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
			wantLivezBody:   `{"lastUpdated":` + now + `,"currentTime":` + now + `,"healthy":true,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
		},
		{
			name:            "update queued longer than the timeout",
			setup:           func(s *ProxyHealthServer) { s.Updated(model.IPv4); s.QueuedUpdate(model.IPv4) },
			node:            readyNode(),
			wantHealthz:     503,
			wantLivez:       503,
			wantHealthzBody: `{"lastUpdated":` + sync + `,"currentTime":` + now + `,"nodeEligible":true,"healthy":false,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":false}}}`,
			wantLivezBody:   `{"lastUpdated":` + sync + `,"currentTime":` + now + `,"healthy":false,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":false}}}`,
		},
		{
			name: "dual-stack with one family behind",
			setup: func(s *ProxyHealthServer) {
				s.Updated(model.IPv4)
				s.Updated(model.IPv6)
				s.QueuedUpdate(model.IPv6)
			},
			node:            readyNode(),
			wantHealthz:     503,
			wantLivez:       503,
			wantHealthzBody: `{"lastUpdated":` + sync + `,"currentTime":` + now + `,"nodeEligible":true,"healthy":false,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true},"IPv6":{"lastUpdated":` + sync + `,"healthy":false}}}`,
			wantLivezBody:   `{"lastUpdated":` + sync + `,"currentTime":` + now + `,"healthy":false,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true},"IPv6":{"lastUpdated":` + sync + `,"healthy":false}}}`,
		},
		{
			name:            "update queued but never synced",
			setup:           func(s *ProxyHealthServer) { s.QueuedUpdate(model.IPv6) },
			node:            readyNode(),
			wantHealthz:     503,
			wantLivez:       503,
			wantHealthzBody: `{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":` + now + `,"nodeEligible":true,"healthy":false,"status":{"IPv6":{"lastUpdated":"0001-01-01T00:00:00Z","healthy":false}}}`,
			wantLivezBody:   `{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":` + now + `,"healthy":false,"status":{"IPv6":{"lastUpdated":"0001-01-01T00:00:00Z","healthy":false}}}`,
		},
		{
			name:            "node missing",
			setup:           func(s *ProxyHealthServer) { s.Updated(model.IPv4) },
			node:            nil,
			wantHealthz:     503,
			wantLivez:       200,
			wantHealthzBody: `{"lastUpdated":` + sync + `,"currentTime":` + now + `,"nodeEligible":false,"healthy":false,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
			wantLivezBody:   `{"lastUpdated":` + now + `,"currentTime":` + now + `,"healthy":true,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
		},
		{
			name:            "node being deleted",
			setup:           func(s *ProxyHealthServer) { s.Updated(model.IPv4) },
			node:            deleting,
			wantHealthz:     503,
			wantLivez:       200,
			wantHealthzBody: `{"lastUpdated":` + sync + `,"currentTime":` + now + `,"nodeEligible":false,"healthy":false,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
			wantLivezBody:   `{"lastUpdated":` + now + `,"currentTime":` + now + `,"healthy":true,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
		},
		{
			name:            "node tainted for deletion by the cluster autoscaler",
			setup:           func(s *ProxyHealthServer) { s.Updated(model.IPv4) },
			node:            tainted,
			wantHealthz:     503,
			wantLivez:       200,
			wantHealthzBody: `{"lastUpdated":` + sync + `,"currentTime":` + now + `,"nodeEligible":false,"healthy":false,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
			wantLivezBody:   `{"lastUpdated":` + now + `,"currentTime":` + now + `,"healthy":true,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
		},
		{
			name:            "node with an unrelated taint",
			setup:           func(s *ProxyHealthServer) { s.Updated(model.IPv4) },
			node:            otherTaint,
			wantHealthz:     200,
			wantLivez:       200,
			wantHealthzBody: `{"lastUpdated":` + now + `,"currentTime":` + now + `,"nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
			wantLivezBody:   `{"lastUpdated":` + now + `,"currentTime":` + now + `,"healthy":true,"status":{"IPv4":{"lastUpdated":` + sync + `,"healthy":true}}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, c := newTestProxyServer()
			tc.setup(s)
			s.SyncNode(tc.node)
			c.Step(2 * time.Minute)
			h := s.Handler()

			for _, r := range []struct {
				path     string
				vec      *prometheus.CounterVec
				wantCode int
				wantBody string
			}{
				{"/healthz", metrics.ProxyHealthzTotal, tc.wantHealthz, tc.wantHealthzBody},
				{"/livez", metrics.ProxyLivezTotal, tc.wantLivez, tc.wantLivezBody},
			} {
				before := counter(t, r.vec, itoa(r.wantCode))
				code, hdr, body := get(t, h, r.path)
				if code != r.wantCode {
					t.Errorf("%s: code %d, want %d", r.path, code, r.wantCode)
				}
				if body != r.wantBody {
					t.Errorf("%s: body\n got %s\nwant %s", r.path, body, r.wantBody)
				}
				if ct := hdr.Get("Content-Type"); ct != "application/json" {
					t.Errorf("%s: Content-Type %q", r.path, ct)
				}
				if n := hdr.Get("X-Content-Type-Options"); n != "nosniff" {
					t.Errorf("%s: X-Content-Type-Options %q", r.path, n)
				}
				if got := counter(t, r.vec, itoa(r.wantCode)) - before; got != 1 {
					t.Errorf("%s: counter for code %d grew by %v, want 1", r.path, r.wantCode, got)
				}
			}
		})
	}
}

func itoa(code int) string {
	b, _ := json.Marshal(code)
	return string(b)
}

func TestQueuedUpdateGoesStaleAfterTimeout(t *testing.T) {
	s, c := newTestProxyServer()
	s.SyncNode(readyNode())
	s.Updated(model.IPv4)
	c.Step(time.Second)
	s.QueuedUpdate(model.IPv4)

	healthz := func() int { code, _, _ := get(t, s.Handler(), "/healthz"); return code }

	c.Step(timeout - time.Nanosecond)
	if code := healthz(); code != 200 {
		t.Fatalf("just inside the timeout: %d, want 200", code)
	}
	// A later update does not restart the clock: the oldest waiting one counts.
	s.QueuedUpdate(model.IPv4)
	c.Step(time.Nanosecond)
	if code := healthz(); code != 503 {
		t.Fatalf("at the timeout: %d, want 503", code)
	}
	if s.IsHealthy() {
		t.Error("IsHealthy() = true while an update is stale")
	}
	s.Updated(model.IPv4)
	if code := healthz(); code != 200 {
		t.Fatalf("after a sync: %d, want 200", code)
	}
	// The next queued update starts a new clock.
	s.QueuedUpdate(model.IPv4)
	c.Step(timeout - time.Nanosecond)
	if !s.IsHealthy() {
		t.Error("IsHealthy() = false for an update queued less than the timeout ago")
	}
}

func TestNodeEligible(t *testing.T) {
	deleting := readyNode()
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	tainted := readyNode()
	tainted.Spec.Taints = []v1.Taint{{Key: ToBeDeletedTaint, Value: "1700000000", Effect: v1.TaintEffectNoSchedule}}
	for _, tc := range []struct {
		name string
		node *v1.Node
		want bool
	}{
		{"missing", nil, false},
		{"ready", readyNode(), true},
		{"being deleted", deleting, false},
		{"tainted ToBeDeletedByClusterAutoscaler", tainted, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NodeEligible(tc.node); got != tc.want {
				t.Errorf("NodeEligible = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	bound := make(chan string, 1)
	s := newProxyHealthServer("ignored:1", timeout, testingclock.NewFakeClock(t0), func(ctx context.Context, network, _ string) (net.Listener, error) {
		l, err := (&net.ListenConfig{}).Listen(ctx, network, "127.0.0.1:0")
		if err == nil {
			bound <- l.Addr().String()
		}
		return l, err
	})
	s.SyncNode(readyNode())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var addr string
	select {
	case addr = <-bound:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not listen")
	}
	resp, err := http.Get("http://" + addr + "/livez")
	if err != nil {
		t.Fatalf("GET /livez: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /livez: %d %s", resp.StatusCode, body)
	}
	asynctest.Stop(t, "Run", cancel, done)
}

func TestRunReportsListenFailure(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s := NewProxyHealthServer(busy.Addr().String(), timeout)
	err = s.Run(context.Background())
	if err == nil {
		t.Fatal("Run on a busy port returned nil")
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Errorf("error %v does not wrap the listen error", err)
	}
}
