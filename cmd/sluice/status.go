package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
)

// Exit codes of `sluice status` and `sluice explain` (the daemon itself exits 0 or 1).
const (
	// exitFailure: bad flags or arguments, or anything else that went wrong.
	exitFailure = 1
	// exitUnreachable: the daemon's state endpoint could not be read.
	exitUnreachable = 2
	// exitServicesFailed: sluice answered, and a Service (or a whole sync) failed.
	exitServicesFailed = 3
)

// defaultServer is where the daemon serves /debug/sluice/state by default: its
// metricsBindAddress, 127.0.0.1:10249.
const defaultServer = "http://127.0.0.1:10249"

// exitCodeError ends the command line with a given exit code. With a nil err nothing more
// is printed (the command has said what it had to).
type exitCodeError struct {
	code int
	err  error
}

func (e *exitCodeError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit code %d", e.code)
	}
	return e.err.Error()
}

func (e *exitCodeError) Unwrap() error { return e.err }

// serverFlags are the flags of the commands that read the daemon's state.
type serverFlags struct {
	server  string
	timeout time.Duration
}

func (f *serverFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.server, "server", defaultServer, "URL of the sluice daemon's metrics server (its metricsBindAddress), which serves "+app.StatePath)
	cmd.Flags().DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for the daemon's answer")
}

// url returns the server's URL for path; "host:port" is read as http://host:port.
func (f *serverFlags) url(path string) string {
	s := strings.TrimRight(f.server, "/")
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	return s + path
}

// fetch GETs path from the daemon. A daemon that cannot be reached, or that answers
// something other than 200, is an exitUnreachable error saying what to check.
func (f *serverFlags) fetch(ctx context.Context, path string) ([]byte, error) {
	url := f.url(path)
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, &exitCodeError{exitFailure, fmt.Errorf("--server %q: %w", f.server, err)}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, &exitCodeError{exitUnreachable, fmt.Errorf("cannot reach sluice at %s: %w\n"+
			"Is sluice running on this node, and is --server its metricsBindAddress (default 127.0.0.1:10249)? "+
			"For a node in a network namespace, run the command inside it (ip netns exec NETNS sluice ...)", url, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, &exitCodeError{exitUnreachable, fmt.Errorf("reading %s: %w", url, err)}
	}
	if resp.StatusCode != http.StatusOK {
		hint := ""
		if resp.StatusCode == http.StatusNotFound {
			hint = " (is this sluice? kube-proxy has no state endpoint)"
		}
		return nil, &exitCodeError{exitUnreachable, fmt.Errorf("%s answered %s%s", url, resp.Status, hint)}
	}
	return body, nil
}

// fetchReport reads and decodes the daemon's StatusReport; it returns the raw body too.
func (f *serverFlags) fetchReport(ctx context.Context) (*app.StatusReport, []byte, error) {
	body, err := f.fetch(ctx, app.StatePath)
	if err != nil {
		return nil, nil, err
	}
	var r app.StatusReport
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, nil, &exitCodeError{exitUnreachable, fmt.Errorf("%s did not answer a sluice status report: %w", f.url(app.StatePath), err)}
	}
	if r.Schema != app.StatusReportSchema {
		return nil, nil, &exitCodeError{exitUnreachable, fmt.Errorf("%s answered schema %q; this sluice reads %q", f.url(app.StatePath), r.Schema, app.StatusReportSchema)}
	}
	return &r, body, nil
}

func newStatusCommand(stdout io.Writer) *cobra.Command {
	var sf serverFlags
	var output string
	cmd := &cobra.Command{
		Use:   "status [NAMESPACE[/NAME]...]",
		Short: "Show what a running sluice programmed, per Service, and how its last syncs went",
		Long: `status reads a running sluice's ` + app.StatePath + ` (on its metrics server) and prints,
per IP family, the last syncs (when, whether full, how long, the error of a failed one) and,
per Service port, whether it is programmed or failed (with the error), and how many endpoints
its Cluster and Local lists hold (ready/terminating; "-" when the port does not use that policy).
Arguments keep only the Services of a namespace, or single Services.

Exit status: 0 when every Service is programmed, 1 on bad flags or arguments, 2 when the daemon
cannot be reached (or is not sluice), 3 when a Service failed or the last sync of a family failed.`,
		Example: `  sluice status
  sluice status kube-system/kube-dns
  sluice status -o json --server http://127.0.0.1:10249
  ip netns exec NODE_NETNS sluice status      # a node in a network namespace (the sandbox)`,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			report, raw, err := sf.fetchReport(cmd.Context())
			if err != nil {
				return err
			}
			failed := reportFailed(report)
			if output == "json" {
				if _, err := stdout.Write(raw); err != nil {
					return err
				}
			} else if err := writeStatus(stdout, report, sf.url(""), args, time.Now()); err != nil {
				return err
			}
			if failed {
				return &exitCodeError{code: exitServicesFailed}
			}
			return nil
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, or json (the daemon's report as it is)")
	return cmd
}

// reportFailed reports whether a family's last sync failed or a Service could not be
// programmed.
func reportFailed(r *app.StatusReport) bool {
	for _, f := range r.Families {
		if f.Status.LastError != "" || len(f.Status.Failed) > 0 {
			return true
		}
	}
	return false
}

// writeStatus renders the report for people. filters are "namespace" or
// "namespace/name"; none keeps everything.
func writeStatus(w io.Writer, r *app.StatusReport, server string, filters []string, now time.Time) error {
	var b strings.Builder
	fmt.Fprintf(&b, "sluice on node %s: mode %s", r.Node, r.Mode)
	if r.Backend != "" && r.Backend != r.Mode {
		fmt.Fprintf(&b, " (backend %s)", r.Backend)
	}
	fmt.Fprintf(&b, ", read from %s\n", server)
	for _, fam := range r.Families {
		st := fam.Status
		family := st.Family
		if family == "" {
			family = fam.State.Family
		}
		fmt.Fprintf(&b, "\n%s: %s\n", family, syncLine(st, now))
		if st.LastError != "" {
			fmt.Fprintf(&b, "  last sync FAILED: %s\n", st.LastError)
		}
		if n := len(fam.State.Problems); n > 0 {
			fmt.Fprintf(&b, "  %d problem(s) in API objects (skipped fields; see -o json)\n", n)
		}
		ports := filterPorts(fam.State.Services, filters)
		if len(ports) == 0 {
			b.WriteString("  no Service ports\n")
			continue
		}
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  SERVICE\tPORT\tTYPE\tSTATUS\tCLUSTER(ready/term)\tLOCAL(ready/term)")
		var errs []string
		for i := range ports {
			sp := &ports[i]
			key := sp.Namespace + "/" + sp.Name
			status := "programmed"
			switch {
			case st.LastSync.IsZero():
				status = "pending (no sync yet)"
			case st.Failed[key] != "":
				status = "FAILED"
				if !slices.Contains(errs, key) {
					errs = append(errs, key)
				}
			case st.LastError != "":
				status = "unknown (last sync failed)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", key, portLabel(sp), sp.Type, status,
				endpointCounts(sp.ClusterEndpoints), endpointCounts(sp.LocalEndpoints))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, key := range errs {
			fmt.Fprintf(&b, "  %s failed: %s\n", key, st.Failed[key])
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// syncLine summarises a family's syncs, e.g. "last sync 2026-03-04T05:06:07Z (2s ago),
// full, took 4ms; 7 syncs".
func syncLine(st syncloop.FamilyStatus, now time.Time) string {
	if st.LastSync.IsZero() {
		return "no sync yet (waiting for the first list of Services and EndpointSlices?)"
	}
	kind := "partial"
	if !st.LastFullSync.IsZero() && st.LastFullSync.Equal(st.LastSync) {
		kind = "full"
	}
	if st.LastError != "" {
		kind = "failed"
	}
	took := time.Duration(st.LastSyncDuration * float64(time.Second)).Round(time.Microsecond)
	s := fmt.Sprintf("last sync %s, %s, took %s; %d syncs", stamp(st.LastSync, now), kind, took, st.Syncs)
	if !st.LastSuccess.Equal(st.LastSync) {
		s += ", last success " + stamp(st.LastSuccess, now)
	}
	if kind != "full" {
		s += ", last full sync " + stamp(st.LastFullSync, now)
	}
	return s
}

// stamp renders a time with how long ago it was.
func stamp(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	ago := now.Sub(t).Round(time.Second)
	if ago < 0 {
		ago = 0
	}
	return fmt.Sprintf("%s (%s ago)", t.Local().Format(time.RFC3339), ago)
}

func portLabel(sp *model.ServicePortView) string {
	if sp.PortName != "" {
		return fmt.Sprintf("%s:%d/%s", sp.PortName, sp.Port, sp.Protocol)
	}
	return fmt.Sprintf("%d/%s", sp.Port, sp.Protocol)
}

// endpointCounts renders a list as "ready/terminating", "-" when the policy is unused.
func endpointCounts(eps []model.EndpointView) string {
	if eps == nil {
		return "-"
	}
	ready, terminating := 0, 0
	for _, e := range eps {
		if e.Terminating {
			terminating++
		} else if e.Ready {
			ready++
		}
	}
	return fmt.Sprintf("%d/%d", ready, terminating)
}

// filterPorts keeps the ports of the Services the filters name.
func filterPorts(ports []model.ServicePortView, filters []string) []model.ServicePortView {
	if len(filters) == 0 {
		return ports
	}
	var out []model.ServicePortView
	for _, sp := range ports {
		for _, f := range filters {
			ns, name, hasName := strings.Cut(f, "/")
			if sp.Namespace == ns && (!hasName || sp.Name == name) {
				out = append(out, sp)
				break
			}
		}
	}
	return out
}
