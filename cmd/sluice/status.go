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
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/conntrack"
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
// metricsBindAddress, 127.0.0.1:10249; with another address, 127.0.0.1 at its port still
// answers (app.DebugPathPrefix pages answer loopback clients only).
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
	cmd.Flags().StringVar(&f.server, "server", defaultServer, "URL of the sluice daemon's metrics server on this node's loopback (its metricsBindAddress port), which serves "+app.StatePath+" to loopback clients only")
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
			"Is sluice running on this node, and is --server 127.0.0.1 at its metricsBindAddress port (default 127.0.0.1:10249)? "+
			"For a node in a network namespace, run the command inside it (ip netns exec NETNS sluice ...)", url, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, &exitCodeError{exitUnreachable, fmt.Errorf("reading %s: %w", url, err)}
	}
	if resp.StatusCode != http.StatusOK {
		hint := ""
		switch resp.StatusCode {
		case http.StatusNotFound:
			hint = " (is this sluice? kube-proxy has no state endpoint)"
		case http.StatusForbidden:
			hint = " (sluice answers " + app.StatePath + " only over loopback: run this on the node, for example with kubectl exec in the sluice pod, against 127.0.0.1)"
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
	var opts statusOptions
	cmd := &cobra.Command{
		Use:   "status [NAMESPACE[/NAME]...]",
		Short: "Show what a running sluice programmed, per Service, and how its last syncs went",
		Long: `status reads a running sluice's ` + app.StatePath + ` (on its metrics server) and prints
the node's conntrack table (entries, limit, drops), and per IP family the last syncs (when,
whether full, how long, the error of a failed one), how many Service ports are programmed,
failed or pending, how many have no endpoints, and then the ports that failed or are
pending: a node with 10 000 Services prints a screenful, not 10 000 lines.

Per listed port: its status, and how many endpoints its Cluster and Local lists hold
(ready/terminating; "-" when the port does not use that policy). Port states:
  programmed          the last successful sync programmed it, and it has not changed since
  failed              its Service could not be programmed (the error follows the table)
  pending             changed since the last successful sync (or no sync yet): waiting for
                      the next sync, or for a failing one to succeed
and, whatever the state, the traffic conditions an operator hunts for:
  no-endpoints        no usable endpoint anywhere: clients are refused
  no-local-endpoints  a Local traffic policy and no endpoint on this node: that traffic is
                      dropped here

Arguments list every port of a namespace or of single Services; --all lists every port;
--state lists the ports in the given states. Names longer than 40 characters are shortened
in the middle; -o wide prints them whole, -o json prints the daemon's report as it is.

Exit status: 0 when every Service is programmed, 1 on bad flags or arguments, 2 when the daemon
cannot be reached (or is not sluice), 3 when a Service failed or the last sync of a family failed.`,
		Example: `  sluice status
  sluice status kube-system/kube-dns
  sluice status --state no-endpoints
  sluice status --all -o wide
  sluice status -o json --server http://127.0.0.1:10249
  ip netns exec NODE_NETNS sluice status      # a node in a network namespace (the sandbox)`,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch output {
			case "text", "json":
			case "wide":
				opts.wide = true
			default:
				return fmt.Errorf("--output %q: want text, wide or json", output)
			}
			for _, s := range opts.states {
				if !slices.Contains(portStates, s) {
					return fmt.Errorf("--state %q: want one of %s", s, strings.Join(portStates, ", "))
				}
			}
			opts.filters = args
			report, raw, err := sf.fetchReport(cmd.Context())
			if err != nil {
				return err
			}
			failed := reportFailed(report)
			if output == "json" {
				if _, err := stdout.Write(raw); err != nil {
					return err
				}
			} else if err := writeStatus(stdout, report, sf.url(""), opts, time.Now()); err != nil {
				return err
			}
			if failed {
				return &exitCodeError{code: exitServicesFailed}
			}
			return nil
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, wide (text with names never shortened), or json (the daemon's report as it is)")
	cmd.Flags().BoolVarP(&opts.all, "all", "A", false, "list every Service port, not only those that failed or are pending")
	cmd.Flags().StringSliceVar(&opts.states, "state", nil, "list the Service ports in these states: "+strings.Join(portStates, ", "))
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

// Port states and conditions `sluice status` counts, and --state selects.
const (
	stateFailed          = "failed"
	statePending         = "pending"
	stateProgrammed      = "programmed"
	condNoEndpoints      = "no-endpoints"
	condNoLocalEndpoints = "no-local-endpoints"
	defaultListedStates  = "failed,pending"
	maxListedByDefault   = 20
	maxNameWidth         = 40
	maxPortWidth         = 26
	maxErrorWidth        = 110
	nearlyFullConntrack  = 0.8
)

// portStates are the values of --state, in the order they are counted.
var portStates = []string{stateProgrammed, stateFailed, statePending, condNoEndpoints, condNoLocalEndpoints}

// statusOptions are what `sluice status` lists, and how.
type statusOptions struct {
	// filters are "namespace" or "namespace/name"; none keeps every Service.
	filters []string
	// states lists the ports in these states or conditions.
	states []string
	// all lists every port.
	all bool
	// wide never shortens names.
	wide bool
}

// listsEverything reports whether every selected port is listed (no cap, no state filter).
func (o statusOptions) listsEverything() bool {
	return o.all || (len(o.filters) > 0 && len(o.states) == 0)
}

// classifiedPort is a Service port with its state and conditions.
type classifiedPort struct {
	port       *model.ServicePortView
	key        string // namespace/name
	state      string // stateFailed, statePending or stateProgrammed
	conditions []string
}

func (p classifiedPort) in(states []string) bool {
	return slices.Contains(states, p.state) || slices.ContainsFunc(p.conditions, func(c string) bool { return slices.Contains(states, c) })
}

// classify gives every port of a family its state (see the command's help).
func classify(fam app.FamilyReport, ports []model.ServicePortView) []classifiedPort {
	unapplied := make(map[string]bool, len(fam.Unapplied))
	for _, k := range fam.Unapplied {
		unapplied[k] = true
	}
	out := make([]classifiedPort, len(ports))
	for i := range ports {
		sp := &ports[i]
		p := classifiedPort{port: sp, key: sp.Namespace + "/" + sp.Name, state: stateProgrammed}
		switch {
		case fam.Status.Failed[p.key] != "":
			p.state = stateFailed
		case fam.Status.LastSuccess.IsZero() || unapplied[p.key]:
			p.state = statePending
		}
		if !sp.HasAnyEndpoints {
			p.conditions = append(p.conditions, condNoEndpoints)
		} else if sp.LocalEndpoints != nil && len(sp.LocalEndpoints) == 0 {
			p.conditions = append(p.conditions, condNoLocalEndpoints)
		}
		out[i] = p
	}
	return out
}

// writeStatus renders the report for people; times are shown in now's location.
func writeStatus(w io.Writer, r *app.StatusReport, server string, opts statusOptions, now time.Time) error {
	var b strings.Builder
	fmt.Fprintf(&b, "sluice on node %s: mode %s", r.Node, r.Mode)
	if r.Backend != "" && r.Backend != r.Mode {
		fmt.Fprintf(&b, " (backend %s)", r.Backend)
	}
	fmt.Fprintf(&b, ", read from %s\n", server)
	if r.Conntrack != nil {
		writeConntrack(&b, r.Conntrack)
	}
	shortened := false
	for _, fam := range r.Families {
		st := fam.Status
		family := st.Family
		if family == "" {
			family = fam.State.Family
		}
		fmt.Fprintf(&b, "\n%s: %s", family, syncLines(st, now))
		if st.LastError != "" {
			writeWrapped(&b, "  last sync FAILED: ", st.LastError)
			if !st.LastSuccess.IsZero() {
				b.WriteString("  (the rules of the last successful sync stay; pending ports wait for a sync to succeed)\n")
			}
		}
		if n := len(fam.State.Problems); n > 0 {
			fmt.Fprintf(&b, "  %d problem(s) in API objects (skipped fields; see -o json)\n", n)
		}
		ports := classify(fam, filterPorts(fam.State.Services, opts.filters))
		if len(ports) == 0 {
			b.WriteString("  no Service ports\n")
			continue
		}
		b.WriteString(countsLine(ports))

		listed, more := selectListed(ports, opts)
		if len(listed) > 0 {
			s, err := portTable(listed, st, opts.wide)
			if err != nil {
				return err
			}
			b.WriteString(s.text)
			shortened = shortened || s.shortened
		}
		switch {
		case more > 0:
			fmt.Fprintf(&b, "  ... and %d more failed or pending ports: --state %s lists them all\n", more, defaultListedStates)
		case !opts.listsEverything() && len(opts.states) == 0 && len(listed) < len(ports):
			fmt.Fprintf(&b, "  (only failed and pending ports are listed; --all lists all %d, --state STATE or NAMESPACE[/NAME] some)\n", len(ports))
		}
	}
	if shortened {
		fmt.Fprintf(&b, "\nNames longer than %d characters are shortened in the middle (…); -o wide or -o json show them whole.\n", maxNameWidth)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// countsLine counts a family's ports by state and condition.
func countsLine(ports []classifiedPort) string {
	count := map[string]int{}
	for _, p := range ports {
		count[p.state]++
		for _, c := range p.conditions {
			count[c]++
		}
	}
	noun := "Service ports"
	if len(ports) == 1 {
		noun = "Service port"
	}
	s := fmt.Sprintf("  %d %s: %d programmed, %d failed, %d pending\n", len(ports), noun, count[stateProgrammed], count[stateFailed], count[statePending])
	var conds []string
	if n := count[condNoEndpoints]; n > 0 {
		conds = append(conds, fmt.Sprintf("%d without endpoints (clients refused)", n))
	}
	if n := count[condNoLocalEndpoints]; n > 0 {
		conds = append(conds, fmt.Sprintf("%d without local endpoints (Local traffic dropped here)", n))
	}
	if len(conds) > 0 {
		s += "  " + strings.Join(conds, ", ") + "\n"
	}
	return s
}

// selectListed returns the ports to list, failed before pending before the rest, and how
// many more the default listing left out.
func selectListed(ports []classifiedPort, opts statusOptions) (listed []classifiedPort, more int) {
	switch {
	case opts.all:
		return ports, 0
	case len(opts.states) > 0:
		for _, p := range ports {
			if p.in(opts.states) {
				listed = append(listed, p)
			}
		}
		return listed, 0
	case len(opts.filters) > 0:
		return ports, 0
	}
	for _, state := range []string{stateFailed, statePending} {
		for _, p := range ports {
			if p.state == state {
				listed = append(listed, p)
			}
		}
	}
	if len(listed) > maxListedByDefault {
		return listed[:maxListedByDefault], len(listed) - maxListedByDefault
	}
	return listed, 0
}

type renderedTable struct {
	text      string
	shortened bool
}

// portTable renders ports as a table, then the errors of their failed Services.
func portTable(ports []classifiedPort, st syncloop.FamilyStatus, wide bool) (renderedTable, error) {
	var b strings.Builder
	var out renderedTable
	shorten := func(s string, max int) string {
		if wide {
			return s
		}
		short := shortenMiddle(s, max)
		out.shortened = out.shortened || short != s
		return short
	}
	// shortenKey shortens "namespace/name" to maxNameWidth, each part in its middle so
	// that both stay recognisable, the shorter one first given what it needs.
	shortenKey := func(ns, name string) string {
		key := ns + "/" + name
		budget := maxNameWidth - 1
		if wide || utf8.RuneCountInString(key) <= maxNameWidth {
			return key
		}
		nsWidth := max(budget/2, budget-utf8.RuneCountInString(name))
		ns = shortenMiddle(ns, nsWidth)
		out.shortened = true
		return ns + "/" + shortenMiddle(name, budget-utf8.RuneCountInString(ns))
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  SERVICE\tPORT\tTYPE\tSTATUS\tCLUSTER\tLOCAL")
	var failed []string
	for _, p := range ports {
		status := p.state
		if p.state == stateFailed {
			status = "FAILED"
			if !slices.Contains(failed, p.key) {
				failed = append(failed, p.key)
			}
		}
		sp := p.port
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", shortenKey(p.port.Namespace, p.port.Name), shorten(portLabel(sp), maxPortWidth), sp.Type, status,
			endpointCounts(sp.ClusterEndpoints), endpointCounts(sp.LocalEndpoints))
	}
	if err := tw.Flush(); err != nil {
		return out, err
	}
	b.WriteString("  (CLUSTER, LOCAL: endpoints ready/terminating under each traffic policy; - when unused)\n")
	for _, key := range failed {
		ns, name, _ := strings.Cut(key, "/")
		writeWrapped(&b, "  "+shortenKey(ns, name)+" failed: ", st.Failed[key])
	}
	out.text = b.String()
	return out, nil
}

// shortenMiddle cuts s to max characters, keeping its start and its end around an
// ellipsis: names that share a long prefix stay apart.
func shortenMiddle(s string, max int) string {
	r := []rune(s)
	if len(r) <= max {
		return s
	}
	head := (max - 1) / 2
	tail := max - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}

// writeWrapped writes prefix and text, wrapped at word boundaries to maxErrorWidth, the
// continuation lines indented by four spaces.
func writeWrapped(b *strings.Builder, prefix, text string) {
	line := prefix
	width := utf8.RuneCountInString(line)
	first := true
	for _, word := range strings.Fields(text) {
		n := utf8.RuneCountInString(word)
		if !first && width+1+n > maxErrorWidth {
			b.WriteString(line + "\n")
			line, width, first = "    ", 4, true
		}
		if !first {
			line += " "
			width++
		}
		line += word
		width += n
		first = false
	}
	b.WriteString(line + "\n")
}

// writeConntrack summarises the node's conntrack table: how full, and the kernel's drop
// counters.
func writeConntrack(b *strings.Builder, ct *conntrack.Status) {
	if ct.Error != "" {
		writeWrapped(b, "conntrack: cannot be read: ", ct.Error)
		return
	}
	fmt.Fprintf(b, "conntrack: %d entries", ct.Entries)
	switch {
	case ct.Limit == nil:
		b.WriteString(" (limit unknown)")
	case *ct.Limit == 0:
		b.WriteString(" (no limit)")
	default:
		fill := float64(ct.Entries) / float64(*ct.Limit)
		fmt.Fprintf(b, " of %d (%.1f%%)", *ct.Limit, fill*100)
		if fill >= nearlyFullConntrack {
			b.WriteString(", NEARLY FULL: new connections are dropped at the limit")
		}
	}
	var drops []string
	for _, name := range []string{"drop", "early_drop", "insert_failed", "chain_toolong"} {
		if v, ok := ct.Counters[name]; ok {
			drops = append(drops, fmt.Sprintf("%s %d", name, v))
		}
	}
	b.WriteString("\n")
	if len(drops) > 0 {
		b.WriteString("  kernel counters since the namespace was created: " + strings.Join(drops, ", ") + "\n")
	}
}

// syncLines summarise a family's syncs, e.g. "last sync 2026-03-04T05:06:07Z (2s ago),
// partial, took 4ms; 7 syncs" and, indented on a second line, when the last full sync and
// the last success were if the last sync was neither.
func syncLines(st syncloop.FamilyStatus, now time.Time) string {
	if st.LastSync.IsZero() {
		return "no sync yet (waiting for the first list of Services and EndpointSlices?)\n"
	}
	kind := "partial"
	if !st.LastFullSync.IsZero() && st.LastFullSync.Equal(st.LastSync) {
		kind = "full"
	}
	if st.LastError != "" {
		kind = "failed"
	}
	took := time.Duration(st.LastSyncDuration * float64(time.Second)).Round(time.Microsecond)
	s := fmt.Sprintf("last sync %s, %s, took %s; %d syncs\n", stamp(st.LastSync, now), kind, took, st.Syncs)
	var earlier []string
	if !st.LastSuccess.Equal(st.LastSync) {
		earlier = append(earlier, "last success "+stamp(st.LastSuccess, now))
	}
	if kind != "full" {
		earlier = append(earlier, "last full sync "+stamp(st.LastFullSync, now))
	}
	if len(earlier) > 0 {
		s += "  " + strings.Join(earlier, ", ") + "\n"
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
	return fmt.Sprintf("%s (%s ago)", t.In(now.Location()).Format(time.RFC3339), ago)
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
