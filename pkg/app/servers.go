package app

import (
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
// explain` read it; e2e tests assert on it.
const StatePath = "/debug/sluice/state"

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

// report builds a StatusReport from the tracker's current state.
func (s *servers) report() StatusReport {
	r := StatusReport{Schema: StatusReportSchema, Node: s.options.Effective.NodeName, Mode: string(s.options.Effective.Mode), Backend: string(s.mode)}
	byFamily := map[string]syncloop.FamilyStatus{}
	for _, st := range s.loop.Status() {
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
	if s.conntrack != nil {
		r.Conntrack = s.conntrack.Status()
	}
	return r
}

// metricsMux serves /metrics, /healthz, /proxyMode, /configz, the state endpoint and,
// with enableProfiling, pprof.
func (s *servers) metricsMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprint(w, s.options.Effective.Mode)
	})
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		// The same shape as upstream's configz: the configuration under its group name.
		writeJSON(w, map[string]any{"kubeproxy.config.k8s.io": s.options.Config})
	})
	mux.HandleFunc(StatePath, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, s.report())
	})
	if s.options.Effective.EnableProfiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		klog.V(2).InfoS("Writing a debug response failed", "err", err)
	}
}

// runMetrics serves the metrics mux, retrying a failed listen every 5 s (or ending sluice
// with bindAddressHardFail), like upstream.
func (s *servers) runMetrics(ctx context.Context, cancel context.CancelCauseFunc) {
	addr := s.options.Effective.MetricsBindAddress
	srv := &http.Server{Handler: s.metricsMux(), ReadHeaderTimeout: 10 * time.Second}
	s.serveWithRetry(ctx, cancel, "metrics", "FailedToStartMetricServer", func() error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		go func() {
			<-ctx.Done()
			_ = srv.Close()
		}()
		klog.FromContext(ctx).Info("Serving metrics", "address", ln.Addr().String())
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}

// runHealthz serves /healthz and /livez unless healthzBindAddress is empty.
func (s *servers) runHealthz(ctx context.Context, h *health.ProxyHealthServer, cancel context.CancelCauseFunc) {
	if s.options.Effective.HealthzBindAddress == "" {
		return
	}
	s.serveWithRetry(ctx, cancel, "healthz", "FailedToStartProxierHealthcheck", func() error { return h.Run(ctx) })
}

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
		if s.options.Effective.BindAddressHardFail {
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
