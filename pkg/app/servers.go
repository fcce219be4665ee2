package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	netutils "k8s.io/utils/net"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/health"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
)

// serverRetryInterval is how long sluice waits before retrying a server that failed to
// listen (upstream: 5 s), unless bindAddressHardFail makes that fatal.
const serverRetryInterval = 5 * time.Second

// StatePath is the debug endpoint, on the metrics server, that serves the desired state
// and the outcome of the last syncs (see StatusReport). `sluice status` and `sluice
// explain` read it; e2e tests assert on it. Like every page under DebugPathPrefix it
// answers only clients that connect over loopback.
const StatePath = "/debug/sluice/state"

// DebugPathPrefix is the prefix of the metrics server's debug pages (StatePath, pprof).
// They list every Service, endpoint and source range the node programs, or expose the
// process's memory, so they answer only clients that connect over loopback: from the node
// itself (or a host-network pod, or `kubectl port-forward`), whatever metricsBindAddress is.
const DebugPathPrefix = "/debug/"

// StatusReportSchema versions StatusReport.
const StatusReportSchema = "sluice.status/v1"

// StatusReport is what StatePath serves.
type StatusReport struct {
	Schema   string         `json:"schema"`
	Node     string         `json:"node"`
	Mode     string         `json:"mode"`
	Backend  string         `json:"backend"`
	Families []FamilyReport `json:"families"`
	// Conntrack is the node's conntrack table: its size, limit and the kernel's statistics
	// (or why they could not be read), read when the report is made.
	Conntrack *conntrack.Status `json:"conntrack,omitempty"`
}

// FamilyReport is one family's desired state and sync outcome.
type FamilyReport struct {
	Status syncloop.FamilyStatus `json:"status"`
	State  model.StateView       `json:"state"`
	// Unapplied lists ("namespace/name") the Services whose state above has not been
	// programmed yet: changed since the last successful sync, or failed in it.
	Unapplied []string `json:"unapplied,omitempty"`
}

// Bounds of every request the metrics server (and its loopback twin) answers. The write
// timeout also bounds pprof: a CPU profile or trace must end before it (the default
// profile takes 30 s; pprof refuses a longer one than the server can write).
const (
	serverReadHeaderTimeout = 5 * time.Second
	serverReadTimeout       = 10 * time.Second
	serverWriteTimeout      = 60 * time.Second
	serverIdleTimeout       = 60 * time.Second
	serverMaxHeaderBytes    = 64 << 10
)

// Concurrency caps of the expensive pages. A request beyond the cap waits up to
// slotWait for a slot, then gets 429 Too Many Requests.
const (
	stateConcurrency = 2
	pprofConcurrency = 2
	slotWait         = 2 * time.Second
)

// State page caching: the report is built again only when a sync has ended since the
// last build (the sync loop's status changed; the tracker's state only changes in a
// sync), and at most once per stateMinAge; stateMaxAge bounds how long a build is trusted
// should anything else change the report.
const (
	stateMinAge = 250 * time.Millisecond
	stateMaxAge = 30 * time.Second
)

type servers struct {
	options  *config.Options
	mode     dataplane.Mode
	tracker  *model.Tracker
	loop     *syncloop.Loop
	families []model.IPFamily
	reporter interface{ NodeWarning(reason, msg string) bool }
	// conntrack reads the conntrack table's health for the report; nil leaves it out.
	conntrack *conntrack.Monitor
}

// report builds a StatusReport from the tracker's current state and status, the sync
// loop's status of each family, without Conntrack: the state page reads that at each
// request (see reportTail), the rest once per sync.
func (s *servers) report(status []syncloop.FamilyStatus) StatusReport {
	r := StatusReport{Schema: StatusReportSchema, Node: s.options.Effective.NodeName, Mode: string(s.options.Effective.Mode), Backend: string(s.mode)}
	byFamily := map[string]syncloop.FamilyStatus{}
	for _, st := range status {
		byFamily[st.Family] = st
	}
	for _, f := range s.families {
		fr := FamilyReport{Status: byFamily[f.String()]}
		if st := s.tracker.Snapshot(f); st != nil {
			fr.State = st.View()
		}
		for _, name := range s.tracker.Unapplied(f) {
			fr.Unapplied = append(fr.Unapplied, name.String())
		}
		r.Families = append(r.Families, fr)
	}
	return r
}

// reportClose ends the JSON of a StatusReport as json.MarshalIndent(r, "", "  ") does.
const reportClose = "\n}"

// encodeReportHead is the state page's cached part for status: the report's JSON, less its
// closing brace, for reportTail to complete.
func (s *servers) encodeReportHead(status []syncloop.FamilyStatus) ([]byte, error) {
	b, err := json.MarshalIndent(s.report(status), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the status report: %w", err)
	}
	head, ok := bytes.CutSuffix(b, []byte(reportClose))
	if !ok {
		return nil, fmt.Errorf("encoding the status report: it does not end with %q", reportClose)
	}
	return head, nil
}

// reportTail is the state page's part read at each request: the conntrack table (cheap,
// and changing all the time) and the closing brace.
func (s *servers) reportTail() ([]byte, error) {
	if s.conntrack == nil {
		return reportTailFor(nil)
	}
	return reportTailFor(s.conntrack.Status())
}

// reportTailFor completes a head from encodeReportHead into what json.MarshalIndent of
// the whole report, with Conntrack ct, would be (TestStatePageIsTheReport checks it):
// Conntrack is StatusReport's last member.
func reportTailFor(ct *conntrack.Status) ([]byte, error) {
	if ct == nil {
		return []byte(reportClose + "\n"), nil
	}
	b, err := json.MarshalIndent(ct, "  ", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the conntrack status: %w", err)
	}
	out := []byte(",\n  \"conntrack\": ")
	out = append(out, b...)
	return append(out, reportClose+"\n"...), nil
}

// metricsHandler serves upstream's pages (/metrics, /healthz, /proxyMode, /configz) to
// anyone who reaches the configured address, and the debug pages (the state page and,
// with enableProfiling, pprof) only to loopback clients.
func (s *servers) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	// Upstream's /healthz on this port is the apiserver library's with its one "ping"
	// check: "ok", or the checks listed with ?verbose, and /healthz/ping.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		setPlainText(w)
		if _, verbose := r.URL.Query()["verbose"]; verbose {
			_, _ = fmt.Fprint(w, "[+]ping ok\nhealthz check passed\n")
			return
		}
		_, _ = fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/healthz/ping", func(w http.ResponseWriter, _ *http.Request) {
		setPlainText(w)
		_, _ = fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		setPlainText(w)
		_, _ = fmt.Fprint(w, s.options.Effective.Mode)
	})
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		// The same shape as upstream's configz: the configuration under its group name.
		b, err := json.Marshal(map[string]any{"kubeproxy.config.k8s.io": s.options.Config})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(b)
	})

	state := newStateCache(s.loop.Status, s.encodeReportHead, s.reportTail, clock.RealClock{})
	debug := http.NewServeMux()
	debug.Handle(StatePath, limitConcurrency(stateConcurrency, slotWait, state))
	if s.options.Effective.EnableProfiling {
		profiles := http.NewServeMux()
		profiles.HandleFunc("/debug/pprof/", pprof.Index)
		profiles.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		profiles.HandleFunc("/debug/pprof/profile", pprof.Profile)
		profiles.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		profiles.HandleFunc("/debug/pprof/trace", pprof.Trace)
		debug.Handle("/debug/pprof/", limitConcurrency(pprofConcurrency, slotWait, profiles))
	}
	mux.Handle(DebugPathPrefix, loopbackOnly(debug))
	return mux
}

// setPlainText sets the headers upstream's plain text pages carry.
func setPlainText(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}

// runMetrics serves the metrics handler on metricsBindAddress, retrying a failed listen
// every 5 s (or ending sluice with bindAddressHardFail), like upstream; an empty address
// (--metrics-port 0) turns it off, as upstream.
//
// When metricsBindAddress is one specific address that is not loopback (say the node's
// InternalIP), the handler is also served on 127.0.0.1 at the same port: the debug pages
// answer only loopback clients, and `sluice status` and `sluice explain` on the node read
// 127.0.0.1:<port> by default, so without it they would have nothing to talk to. A wildcard
// address (0.0.0.0, ::) already includes loopback. That second listener is sluice's own
// addition, so it never ends sluice: a failure is logged, reported and retried.
func (s *servers) runMetrics(ctx context.Context, cancel context.CancelCauseFunc) {
	addr := s.options.Effective.MetricsBindAddress
	if addr == "" {
		return
	}
	handler := s.metricsHandler()
	if lo := loopbackTwin(addr); lo != "" {
		go s.serveWithRetry(ctx, nil, "metrics (loopback)", "FailedToStartMetricServer", func() error {
			return serveHTTP(ctx, lo, handler, "Serving the metrics and debug pages on loopback too, for sluice status and explain")
		})
	}
	s.serveWithRetry(ctx, cancel, "metrics", "FailedToStartMetricServer", func() error {
		return serveHTTP(ctx, addr, handler, "Serving metrics")
	})
}

// loopbackTwin returns the loopback address at which the metrics handler must be served
// too for metricsBindAddress addr ("" when addr already covers loopback).
func loopbackTwin(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	ip := netutils.ParseIPSloppy(host)
	if ip == nil || ip.IsUnspecified() || ip.IsLoopback() {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// newHTTPServer returns a server with the request bounds every sluice server shares.
func newHTTPServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: serverReadHeaderTimeout,
		ReadTimeout:       serverReadTimeout,
		WriteTimeout:      serverWriteTimeout,
		IdleTimeout:       serverIdleTimeout,
		MaxHeaderBytes:    serverMaxHeaderBytes,
	}
}

// serveHTTP listens on addr and serves handler until ctx ends (then it returns nil) or
// serving fails.
func serveHTTP(ctx context.Context, addr string, handler http.Handler, msg string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := newHTTPServer(handler)
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	klog.FromContext(ctx).Info(msg, "address", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// runHealthz serves /healthz and /livez unless healthzBindAddress is empty.
func (s *servers) runHealthz(ctx context.Context, h *health.ProxyHealthServer, cancel context.CancelCauseFunc) {
	if s.options.Effective.HealthzBindAddress == "" {
		return
	}
	s.serveWithRetry(ctx, cancel, "healthz", "FailedToStartProxierHealthcheck", func() error { return h.Run(ctx) })
}

// serveWithRetry runs serve until ctx ends, retrying it every serverRetryInterval when it
// fails. With bindAddressHardFail a failure ends sluice through cancel instead; a nil
// cancel marks a server that never does.
func (s *servers) serveWithRetry(ctx context.Context, cancel context.CancelCauseFunc, name, reason string, serve func() error) {
	logger := klog.FromContext(ctx)
	for {
		err := serve()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("server stopped")
		}
		if cancel != nil && s.options.Effective.BindAddressHardFail {
			cancel(fmt.Errorf("%s server: %w (bindAddressHardFail is set)", name, err))
			return
		}
		logger.Error(err, "Server failed; retrying", "server", name, "retryIn", serverRetryInterval.Seconds())
		if s.reporter != nil {
			s.reporter.NodeWarning(reason, fmt.Sprintf("%s server: %v", name, err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(serverRetryInterval):
		}
	}
}
