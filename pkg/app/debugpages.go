package app

import (
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/sluiceproxy/sluice/pkg/syncloop"
)

// loopbackOnly serves h only to requests that came over loopback, and 403 to the others.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !overLoopback(r) {
			setPlainText(w)
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte("sluice's " + DebugPathPrefix + " pages answer only clients that connect over loopback: " +
				"run `sluice status` or `sluice explain` on the node (or in the sluice pod), or use kubectl port-forward\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// overLoopback reports whether r arrived on a loopback connection: both its peer and the
// local address it connected to are loopback addresses. The peer alone would do on a
// normal node; the local address also rules out a neighbour that routes packets for
// 127.0.0.1 to the node (possible with route_localnet=1, CVE-2020-8558), whose peer
// address is its own, and makes a spoofed 127.x source useless besides.
func overLoopback(r *http.Request) bool {
	remote, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil || !remote.Addr().Unmap().IsLoopback() {
		return false
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	localAddr, err := netip.ParseAddrPort(local.String())
	return err == nil && localAddr.Addr().Unmap().IsLoopback()
}

// limitConcurrency lets at most n requests into h at a time. A request beyond that waits
// up to wait (or until its client goes away), then gets 429 Too Many Requests.
func limitConcurrency(n int, wait time.Duration, h http.Handler) http.Handler {
	slots := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case slots <- struct{}{}:
		case <-timer.C:
			tooMany(w, wait)
			return
		case <-r.Context().Done():
			return
		}
		defer func() { <-slots }()
		h.ServeHTTP(w, r)
	})
}

func tooMany(w http.ResponseWriter, retryAfter time.Duration) {
	setPlainText(w)
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(retryAfter.Seconds()))))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write([]byte("too many concurrent requests for this page; retry later\n"))
}

// stateCache serves the state page from a report built at most once per sync: building
// it copies and renders every Service of every family (see BenchmarkStatePage: 68 MB of
// JSON and seconds of CPU at 10 000 Services), which a client polling the page must not be
// able to repeat at will. A body nobody asked for during stateMaxAge is dropped, so that
// one `sluice status` does not pin its size in memory for the life of the process.
//
// The sync loop's status identifies a sync: it changes (syncs counter, times, errors,
// failed Services) at the end of every sync, after the tracker's state changed, and the
// state changes in no other place. So a build whose status equals the current one shows the
// current state. A build made during a sync sees a status that the sync changes later,
// and is replaced at the next request.
type stateCache struct {
	status func() []syncloop.FamilyStatus
	// encode renders the cached part of the page for a status.
	encode func([]syncloop.FamilyStatus) ([]byte, error)
	// tail renders what follows the cached part, at each request (nil: nothing).
	tail  func() ([]byte, error)
	clock clock.PassiveClock

	// mu serialises builds: concurrent requests wait for the one build and share it.
	mu       sync.Mutex
	body     []byte
	builtFor []syncloop.FamilyStatus
	builtAt  time.Time
	lastUsed time.Time
	// release is pending while a body is kept.
	release *time.Timer
}

func newStateCache(status func() []syncloop.FamilyStatus, encode func([]syncloop.FamilyStatus) ([]byte, error), tail func() ([]byte, error), c clock.PassiveClock) *stateCache {
	return &stateCache{status: status, encode: encode, tail: tail, clock: c}
}

// get returns the cached part of the page, building it if needed.
func (c *stateCache) get() ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	c.lastUsed = now
	age := now.Sub(c.builtAt)
	if c.body != nil && age < stateMinAge {
		return c.body, nil
	}
	status := c.status()
	if c.body != nil && age < stateMaxAge && reflect.DeepEqual(status, c.builtFor) {
		return c.body, nil
	}
	body, err := c.encode(status)
	if err != nil {
		return nil, err
	}
	c.body, c.builtFor, c.builtAt = body, status, now
	if c.release == nil {
		c.release = time.AfterFunc(stateMaxAge, c.dropIfIdle)
	}
	return body, nil
}

// dropIfIdle drops the body if it was not asked for during stateMaxAge, and otherwise
// looks again when it will have been.
func (c *stateCache) dropIfIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if idle := c.clock.Since(c.lastUsed); idle < stateMaxAge {
		c.release.Reset(stateMaxAge - idle)
		return
	}
	c.body, c.builtFor, c.release = nil, nil, nil
}

func (c *stateCache) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := c.get()
	var tail []byte
	if err == nil && c.tail != nil {
		tail, err = c.tail()
	}
	if err != nil {
		klog.FromContext(r.Context()).Error(err, "Building the state page failed")
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+len(tail)))
	// Two writes: the cached part is not copied.
	if _, err := w.Write(body); err == nil {
		_, _ = w.Write(tail)
	}
}
