package health

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// ToBeDeletedTaint is the taint the Cluster Autoscaler puts on a node it is about to
// delete. /healthz fails on such a node so that load balancers drain it first.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// FamilyHealth is the health of the proxying of one IP family, as /healthz and /livez
// report it in "status".
type FamilyHealth struct {
	// LastUpdated is when this family's rules were last synced successfully (the zero time
	// if never).
	LastUpdated time.Time `json:"lastUpdated"`
	// Healthy is false when an update has been queued for longer than the timeout without a
	// successful sync since.
	Healthy bool `json:"healthy"`
}

// ProxyHealth is the JSON body of /healthz and /livez. Field names and the time format
// (RFC 3339 with nanoseconds, as encoding/json writes time.Time) are upstream kube-proxy's.
type ProxyHealth struct {
	// LastUpdated is the latest successful sync of any family; in a 200 response it is the
	// current time instead, as upstream has always reported it.
	LastUpdated time.Time `json:"lastUpdated"`
	// CurrentTime is when the response was computed.
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is set in /healthz responses only: false when the Node object is
	// missing, being deleted, or tainted ToBeDeletedByClusterAutoscaler.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when every family is healthy (and, for /healthz, the node is
	// eligible).
	Healthy bool `json:"healthy"`
	// Status holds the health of each family that has reported a sync or queued an update,
	// keyed "IPv4" / "IPv6".
	Status map[v1.IPFamily]FamilyHealth `json:"status,omitempty"`
}

// ProxyHealthServer tracks whether the sync loops keep up with the updates queued for them
// and whether this node should receive traffic, and serves the answer on /healthz and
// /livez.
//
// The sync loop of each family calls QueuedUpdate when it is asked to sync and Updated
// after every successful sync; the node watcher calls SyncNode. All methods are safe for
// concurrent use.
type ProxyHealthServer struct {
	addr    string
	timeout time.Duration
	clock   clock.PassiveClock
	listen  listenFunc

	mu sync.RWMutex
	// lastUpdated is the time of the last successful sync per family.
	lastUpdated map[model.IPFamily]time.Time
	// oldestQueued is the time of the oldest update queued since the last successful sync
	// per family; no entry means nothing is waiting.
	oldestQueued map[model.IPFamily]time.Time
	// node is the latest Node object seen; nil when unknown or deleted.
	node *v1.Node
}

// NewProxyHealthServer returns a server for addr (host:port; Run listens there) that
// reports a family unhealthy once an update queued for it has waited timeout without a
// successful sync. Upstream (and sluice's app) uses timeout = 2 × syncPeriod.
func NewProxyHealthServer(addr string, timeout time.Duration) *ProxyHealthServer {
	return newProxyHealthServer(addr, timeout, clock.RealClock{}, listenTCP)
}

func newProxyHealthServer(addr string, timeout time.Duration, c clock.PassiveClock, listen listenFunc) *ProxyHealthServer {
	return &ProxyHealthServer{
		addr:         addr,
		timeout:      timeout,
		clock:        c,
		listen:       listen,
		lastUpdated:  map[model.IPFamily]time.Time{},
		oldestQueued: map[model.IPFamily]time.Time{},
	}
}

// QueuedUpdate records that family has an update waiting to be synced. Only the oldest
// waiting update counts: the clock for the timeout starts at the first QueuedUpdate after
// a successful sync.
func (s *ProxyHealthServer) QueuedUpdate(family model.IPFamily) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, waiting := s.oldestQueued[family]; !waiting {
		s.oldestQueued[family] = s.clock.Now()
	}
}

// Updated records a successful sync of family: everything queued so far is programmed.
// Call it also once when a family's sync loop starts (as upstream does), so that
// lastUpdated is meaningful before the first sync.
func (s *ProxyHealthServer) Updated(family model.IPFamily) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.oldestQueued, family)
	s.lastUpdated[family] = s.clock.Now()
}

// SyncNode records the latest state of this node's Node object; nil means it was deleted
// (or has not been seen yet).
func (s *ProxyHealthServer) SyncNode(node *v1.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.node = node
}

// Health returns the health of the sync loops (not the node's eligibility, which only
// /healthz considers) at the current time.
func (s *ProxyHealthServer) Health() ProxyHealth {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.healthLocked(s.clock.Now())
}

// healthLocked computes the health at now. It assumes s.mu is held (read is enough).
func (s *ProxyHealthServer) healthLocked(now time.Time) ProxyHealth {
	h := ProxyHealth{CurrentTime: now, Healthy: true, Status: map[v1.IPFamily]FamilyHealth{}}
	families := map[model.IPFamily]bool{}
	for f := range s.lastUpdated {
		families[f] = true
	}
	for f := range s.oldestQueued {
		families[f] = true
	}
	for f := range families {
		last := s.lastUpdated[f]
		if last.After(h.LastUpdated) {
			h.LastUpdated = last
		}
		healthy := true
		if queued, waiting := s.oldestQueued[f]; waiting && now.Sub(queued) >= s.timeout {
			healthy = false
			h.Healthy = false
		}
		h.Status[v1.IPFamily(f.String())] = FamilyHealth{LastUpdated: last, Healthy: healthy}
	}
	return h
}

// IsHealthy reports whether every family's sync loop is keeping up. The per-Service health
// servers use it: a Service is only reported healthy on a node whose proxy is healthy.
func (s *ProxyHealthServer) IsHealthy() bool {
	return s.Health().Healthy
}

// NodeEligible reports whether the last Node object passed to SyncNode may receive
// load-balancer traffic; see NodeEligible (the function).
func (s *ProxyHealthServer) NodeEligible() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return NodeEligible(s.node)
}

// NodeEligible reports whether node may receive load-balancer traffic: it exists, is not
// being deleted, and is not tainted ToBeDeletedByClusterAutoscaler (whatever the effect).
func NodeEligible(node *v1.Node) bool {
	if node == nil || node.DeletionTimestamp != nil {
		return false
	}
	for _, taint := range node.Spec.Taints {
		if taint.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// Handler returns the handler serving /healthz and /livez (Run serves it; the daemon may
// also mount it elsewhere).
func (s *ProxyHealthServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", s.serveHealthz)
	mux.HandleFunc("/livez", s.serveLivez)
	return mux
}

// serveHealthz answers whether this node should receive traffic: the sync loops keep up
// and the node is eligible.
func (s *ProxyHealthServer) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	s.mu.RLock()
	now := s.clock.Now()
	h := s.healthLocked(now)
	eligible := NodeEligible(s.node)
	s.mu.RUnlock()

	h.NodeEligible = &eligible
	h.Healthy = h.Healthy && eligible
	s.respond(w, h, now, metrics.ProxyHealthzTotal)
}

// serveLivez answers whether the process is alive and its sync loops keep up; the node's
// eligibility plays no part (a draining node's proxy must not be restarted).
func (s *ProxyHealthServer) serveLivez(w http.ResponseWriter, _ *http.Request) {
	s.mu.RLock()
	now := s.clock.Now()
	h := s.healthLocked(now)
	s.mu.RUnlock()

	s.respond(w, h, now, metrics.ProxyLivezTotal)
}

// respond writes h with the status code it implies and counts the code in byCode.
func (s *ProxyHealthServer) respond(w http.ResponseWriter, h ProxyHealth, now time.Time, byCode *prometheus.CounterVec) {
	code := http.StatusServiceUnavailable
	if h.Healthy {
		code = http.StatusOK
		// Before upstream tracked queued updates, lastUpdated was the time of the last
		// sync loop pass, so it was recent whenever the proxy was healthy. Probes written
		// against that still compare it with currentTime, so a healthy answer says "now".
		h.LastUpdated = now
	}
	byCode.WithLabelValues(strconv.Itoa(code)).Inc()
	body, err := json.Marshal(h)
	if err != nil {
		// Cannot happen for this type; answer anyway so the probe sees the code.
		body = []byte(`{}`)
	}
	setJSONHeaders(w)
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// Run listens on the server's address and serves /healthz and /livez until ctx is
// cancelled (then it returns nil) or serving fails. A listen failure is returned at once;
// the caller decides whether to retry (upstream retries every 5 s) or to exit
// (bindAddressHardFail).
func (s *ProxyHealthServer) Run(ctx context.Context) error {
	l, err := s.listen(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen for proxy health checks on %s: %w", s.addr, err)
	}
	klog.FromContext(ctx).V(2).Info("Serving proxy health checks", "address", l.Addr().String())
	srv := newHTTPServer(s.Handler())
	serveDone := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = srv.Close()
		case <-serveDone:
		}
	}()
	err = srv.Serve(l)
	close(serveDone)
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("proxy health server on %s stopped: %w", s.addr, err)
}
