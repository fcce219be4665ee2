//go:build conformance

package conformance

// How a case checks what clients receive, in every cluster at once, and how each check is
// recorded for the comparison with upstream (test/conformance/results).
//
// A check names who probes what in words that are the same in every run ("b1 ->
// ClusterIP IPv6 http/tcp"), says which outcomes it accepts, and observes one round of
// probes in one cluster, summed up as one outcome string ("answered by a0, b0",
// "refused", "timeout"). The check polls each cluster until the outcome is one it accepts,
// or convergeTimeout passes, and records the outcome either way. A cluster that fails a
// check sits out the rest of the case (its later checks would only repeat the failure);
// the others go on.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluiceproxy/sluice/test/conformance/results"
	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/topology"
)

// family is one of the family variants every case that is not family-specific runs in.
type family struct {
	name     string
	families []corev1.IPFamily
	policy   corev1.IPFamilyPolicy
}

var (
	ipv4Only  = family{"IPv4", []corev1.IPFamily{corev1.IPv4Protocol}, corev1.IPFamilyPolicySingleStack}
	ipv6Only  = family{"IPv6", []corev1.IPFamily{corev1.IPv6Protocol}, corev1.IPFamilyPolicySingleStack}
	dualStack = family{"DualStack", []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, corev1.IPFamilyPolicyRequireDualStack}
	// familyVariants are the variants of an ordinary case: a single-stack Service of each
	// family, and a RequireDualStack one reached over both its ClusterIPs.
	familyVariants = []family{ipv4Only, ipv6Only, dualStack}
	// allFamilies is the variant of a disruptive case: it restarts something once and
	// checks a Service of every other variant across the restart.
	allFamilies = family{name: "all"}
)

// T is what a case gets: the test, the environment, its family variant, and the
// bookkeeping of its checks.
type T struct {
	*testing.T
	e    *env
	fam  family
	name string

	mu     sync.Mutex
	seq    int
	failed map[*cluster]bool
}

// runCase runs fn as case name in variant fam, and records how it ended for every cluster.
func runCase(t *testing.T, e *env, name string, fam family, fn func(*T)) {
	ct := &T{T: t, e: e, fam: fam, name: name, failed: map[*cluster]bool{}}
	started := time.Now()
	t.Cleanup(func() {
		took := time.Since(started).Seconds()
		for _, cl := range e.clusters {
			if !cl.runs(name) {
				continue
			}
			result := "pass"
			switch {
			case t.Skipped():
				result = "skip"
			case ct.hasFailed(cl) || (t.Failed() && !ct.anyFailed()):
				result = "fail"
				t.Logf("last lines of the proxies of %s:", cl.name)
				for _, p := range cl.processes() {
					t.Logf("%s (%s):\n%s", p.Name, p.LogPath, p.Tail(25))
				}
			}
			cl.mu.Lock()
			cl.run.Cases = append(cl.run.Cases, results.CaseResult{Case: name, Family: fam.name, Result: result, Seconds: took})
			cl.mu.Unlock()
		}
	})
	if len(ct.clusters()) == 0 {
		// A sluice-only case in a run of upstream alone, or of a mode it is not about.
		t.Skipf("no cluster under test runs %s", name)
	}
	fn(ct)
}

func (t *T) hasFailed(cl *cluster) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed[cl]
}

func (t *T) anyFailed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.failed) > 0
}

// fail marks the cluster as failed for the rest of the case.
func (t *T) fail(cl *cluster, format string, args ...any) {
	t.Helper()
	t.mu.Lock()
	t.failed[cl] = true
	t.mu.Unlock()
	t.Errorf("[%s] "+format, append([]any{cl.name}, args...)...)
}

// clusters are the clusters that run the case and have not failed it.
func (t *T) clusters() []*cluster {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*cluster
	for _, cl := range t.e.clusters {
		if cl.runs(t.name) && !t.failed[cl] {
			out = append(out, cl)
		}
	}
	return out
}

// each runs fn for every cluster still in the case, in parallel, and drops a cluster whose
// fn fails. When no cluster is left the case stops.
func (t *T) each(fn func(cl *cluster) error) {
	t.Helper()
	var wg sync.WaitGroup
	for _, cl := range t.clusters() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(cl); err != nil {
				t.fail(cl, "%v", err)
			}
		}()
	}
	wg.Wait()
	if len(t.clusters()) == 0 {
		t.FailNow()
	}
}

func (t *T) nextSeq() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	return t.seq
}

// ---- clients and targets ---------------------------------------------------------------

// client is where probes come from, by name: a pod ("a1"), a node ("node-a") or the
// external client ("external"), optionally from one of the external client's other
// addresses (source: "external-2", "external/secondary").
type client struct{ host, source string }

func from(host string) client { return client{host: host} }

// via returns the client probing from the named source address.
func (c client) via(source string) client { c.source = source; return c }

func (c client) String() string {
	if c.source != "" {
		return c.host + " (from " + c.source + ")"
	}
	return c.host
}

// target is a frontend of a Service: a name that is the same in every run, the address
// (the same in every cluster) and the protocol.
type target struct {
	name  string
	addr  netip.AddrPort
	proto echo.Protocol
}

// fam is the target's IP family, "IPv4" or "IPv6".
func (tg target) fam() string {
	if tg.addr.Addr().Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// onPort is the same frontend on another port and protocol (one no Service port uses).
func (tg target) onPort(p int32, proto corev1.Protocol) target {
	kind, _, _ := strings.Cut(tg.name, " "+tg.fam())
	return target{
		name:  fmt.Sprintf("%s %s :%d/%s", kind, tg.fam(), p, protoOf(proto)),
		addr:  netip.AddrPortFrom(tg.addr.Addr(), uint16(p)),
		proto: protoOf(proto),
	}
}

func famName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// clusterIPs are the frontends of a Service port on each of the Service's ClusterIPs.
func clusterIPs(t testing.TB, svc *corev1.Service, portName string) []target {
	sp := svcPort(t, svc, portName)
	var out []target
	for _, s := range svc.Spec.ClusterIPs {
		a := netip.MustParseAddr(s)
		out = append(out, target{
			name:  fmt.Sprintf("ClusterIP %s %s/%s", famName(a), sp.Name, protoOf(sp.Protocol)),
			addr:  netip.AddrPortFrom(a, uint16(sp.Port)),
			proto: protoOf(sp.Protocol),
		})
	}
	return out
}

// nodePorts are a Service port's NodePort frontends on a node's addresses, one per family
// of the Service. The addresses are the same in every cluster.
func (e *env) nodePorts(t testing.TB, svc *corev1.Service, portName, node string) []target {
	n := e.clusters[0].topo.Node(node)
	var addrs []netip.Addr
	for _, fam := range svc.Spec.IPFamilies {
		addrs = append(addrs, familyAddr(&n.Host, fam))
	}
	return addrTargets(t, node+" NodePort", addrs, svc, portName, true)
}

// secondaryNodePorts are the NodePort frontends on a node's secondary addresses, outside
// nodePortAddresses.
func (e *env) secondaryNodePorts(t testing.TB, svc *corev1.Service, portName, node string) []target {
	n := e.clusters[0].topo.Node(node)
	var addrs []netip.Addr
	for _, fam := range svc.Spec.IPFamilies {
		for _, a := range n.SecondaryIPs {
			if a.Is4() == (fam == corev1.IPv4Protocol) {
				addrs = append(addrs, a)
			}
		}
	}
	return addrTargets(t, node+" secondary-address NodePort", addrs, svc, portName, true)
}

// vipTargets are a Service port's frontends on load balancer or external IPs.
func vipTargets(t testing.TB, kind string, addrs []netip.Addr, svc *corev1.Service, portName string) []target {
	return addrTargets(t, kind, addrs, svc, portName, false)
}

func addrTargets(t testing.TB, kind string, addrs []netip.Addr, svc *corev1.Service, portName string, nodePort bool) []target {
	sp := svcPort(t, svc, portName)
	p := sp.Port
	if nodePort {
		p = sp.NodePort
	}
	var out []target
	for _, a := range addrs {
		out = append(out, target{
			name:  fmt.Sprintf("%s %s %s/%s", kind, famName(a), sp.Name, protoOf(sp.Protocol)),
			addr:  netip.AddrPortFrom(a, uint16(p)),
			proto: protoOf(sp.Protocol),
		})
	}
	return out
}

// svcPort finds a Service port by name.
func svcPort(t testing.TB, svc *corev1.Service, name string) corev1.ServicePort {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("Service %s/%s has no port %q", svc.Namespace, svc.Name, name)
	return corev1.ServicePort{}
}

func protoOf(p corev1.Protocol) echo.Protocol { return echo.Protocol(strings.ToLower(string(p))) }

// familyAddr picks the address of fam from a host.
func familyAddr(h *topology.Host, fam corev1.IPFamily) netip.Addr {
	if fam == corev1.IPv6Protocol {
		return h.IPv6
	}
	return h.IPv4
}

// host resolves a client's host name in the cluster's topology.
func (cl *cluster) host(name string) *topology.Host {
	switch {
	case name == "external":
		return cl.topo.External
	case cl.topo.Node(name) != nil:
		return &cl.topo.Node(name).Host
	case cl.topo.Pod(name) != nil:
		return &cl.topo.Pod(name).Host
	}
	panic("conformance: no host " + name)
}

// sourceAddr resolves a named source address of the external client, in the family of
// like.
func (cl *cluster) sourceAddr(name string, like netip.Addr) netip.Addr {
	all := append(append([]netip.Addr{}, cl.topo.ExternalIPs...), cl.topo.ExternalSecondaryIPs...)
	for _, a := range all {
		if a.Is4() == like.Is4() && cl.topo.AddressName(a) == name {
			return a
		}
	}
	panic("conformance: the external client has no address " + name + " in the family of " + like.String())
}

// answerTimeout is how long a probe that expects an answer waits: a lost SYN is sent again
// after a second, and on a 2-core machine running eight proxies, sixteen echo servers and
// the control plane, the answer to the retransmission can take another second to be
// scheduled. Waiting longer costs time only when the probe fails.
const answerTimeout = 2500 * time.Millisecond

// probe sends one probe from c to tg in the cluster; a zero timeout is answerTimeout.
func (cl *cluster) probe(c client, tg target, timeout time.Duration) echo.Outcome {
	if timeout == 0 {
		timeout = answerTimeout
	}
	opts := echo.ProbeOptions{Timeout: timeout}
	if c.source != "" {
		opts.Source = cl.sourceAddr(c.source, tg.addr.Addr())
	}
	return cl.host(c.host).Probe(tg.proto, tg.addr, opts)
}

// ---- outcomes ----------------------------------------------------------------------------

// token is one probe's outcome in the words the results use: "a0" for an answer, else
// "refused", "refused after a SYN retransmission" (see echo.Outcome.SYNRetransmits),
// "timeout", "unreachable" or "failed". With seen, an answer carries the name of the
// source address the pod saw: "a0 (seen as node-b/eth0)".
func (cl *cluster) token(out echo.Outcome, seen bool) string {
	switch out.Result {
	case echo.Answered:
		if seen {
			return fmt.Sprintf("%s (seen as %s)", out.Reply.Pod, cl.topo.AddressName(out.Reply.Remote.Addr()))
		}
		return out.Reply.Pod
	case echo.Refused:
		if out.SYNRetransmits > 0 {
			return "refused after a SYN retransmission"
		}
	}
	return string(out.Result)
}

// isAnswer tells an answer's token from the others.
func isAnswer(tok string) bool {
	switch echo.Result(tok) {
	case echo.Refused, echo.Timeout, echo.Unreachable, echo.Failed:
		return false
	}
	return !strings.HasPrefix(tok, "refused")
}

// summarize sums up one round of probe tokens: "answered by a0, b0" when every probe was
// answered (each pod once, sorted), the one result when all agree, else "mixed: ..." with
// counts.
func summarize(tokens []string) string {
	counts := map[string]int{}
	answered := true
	for _, tok := range tokens {
		counts[tok]++
		answered = answered && isAnswer(tok)
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	switch {
	case answered:
		return answeredBy(keys...)
	case len(keys) == 1:
		return keys[0]
	}
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s x%d", k, counts[k]))
	}
	return "mixed: " + strings.Join(parts, ", ")
}

// answeredBy is the outcome of a round answered by exactly these pods.
func answeredBy(pods ...string) string {
	pods = slices.Clone(pods)
	sort.Strings(pods)
	return "answered by " + strings.Join(pods, ", ")
}

// ---- checks ------------------------------------------------------------------------------

// check is one expectation about what clients receive.
type check struct {
	// what says who probes what: "b1 -> ClusterIP IPv6 http/tcp".
	what string
	// want are the outcomes the case expects (from sluice, and from upstream unless
	// differences.yaml says otherwise). Unused when capability is set.
	want []string
	// capability and variant name the capability table entry whose value is expected, and
	// allowed the values the case accepts in the table.
	capability, variant string
	allowed             []string
	// observe makes one observation in a cluster.
	observe func(cl *cluster) string
	// once: the observation is final (it already waited), do not poll.
	once bool
	// fatal are outcomes that fail the check at once, where polling on would only hide
	// them (a UDP flow that went back to its old pod).
	fatal []string
	// only, when set, restricts the check to the clusters it accepts (a measurement made
	// again only where it has to be).
	only func(cl *cluster) bool
}

// run makes the check in every cluster still in the case, in parallel, and records it.
func (t *T) run(c check) {
	t.Helper()
	seq := t.nextSeq()
	t.each(func(cl *cluster) error {
		if c.only != nil && !c.only(cl) {
			return nil
		}
		want, err := t.want(cl, c)
		got, ok := t.poll(cl, c, want)
		cl.mu.Lock()
		cl.run.Checks = append(cl.run.Checks, results.Check{
			Case: t.name, Family: t.fam.name, Seq: seq, Check: c.what,
			Capability: c.capability, Variant: c.variant, Want: want, Outcome: got, OK: ok && err == nil,
		})
		cl.mu.Unlock()
		switch {
		case errors.Is(err, errNoTableEntry):
			// The cluster stays in the case, so that one run records every entry the
			// table lacks.
			t.Errorf("[%s] %s: %v (observed %q)", cl.name, c.what, err, got)
		case err != nil:
			return fmt.Errorf("%s: %w (observed %q)", c.what, err, got)
		case !ok:
			return fmt.Errorf("%s: %q, want %s (for %s)", c.what, got, strings.Join(quoteAll(want), " or "), convergeTimeout)
		}
		return nil
	})
}

// errNoTableEntry is the error of a check whose capability the table has no entry for.
var errNoTableEntry = errors.New("capabilities.json has no entry")

// want is what the cluster must show: the capability table's entry for its backend, or
// the case's expectation; for upstream, the outcome differences.yaml declares for it.
func (t *T) want(cl *cluster, c check) ([]string, error) {
	want := c.want
	if c.capability != "" {
		v, ok := t.e.table.Lookup(c.capability, c.variant, cl.backend)
		if !ok {
			return nil, fmt.Errorf("%w: %s %s for %s (go run ./test/conformance/checkresults -update with this run's results)", errNoTableEntry, c.capability, c.variant, cl.backend)
		}
		if !slices.Contains(c.allowed, v) {
			return nil, fmt.Errorf("capabilities.json says %s %s is %q for %s, which the case does not allow (%s)", c.capability, c.variant, v, cl.backend, strings.Join(quoteAll(c.allowed), ", "))
		}
		want = []string{v}
	}
	d, ok := results.Find(t.e.diffs, cl.backend, results.Check{Case: t.name, Family: t.fam.name, Check: c.what})
	switch {
	case !ok:
	case cl.proxy == results.Upstream:
		want = []string{d.Upstream}
	case !slices.Contains(want, d.Sluice):
		return want, fmt.Errorf("differences.yaml says sluice shows %q, the case expects %v", d.Sluice, want)
	}
	return want, nil
}

// poll observes until the outcome is one of want, or convergeTimeout passes (at once for a
// check made once). Without an expectation (a capability the table lacks), it waits for an
// outcome the case allows, so that what it records for the table is the settled one.
func (t *T) poll(cl *cluster, c check, want []string) (string, bool) {
	target := want
	if len(want) == 0 {
		target = c.allowed
	}
	deadline := time.Now().Add(convergeTimeout)
	for {
		if err := cl.running(); err != nil {
			return err.Error(), false
		}
		got := c.observe(cl)
		if slices.Contains(target, got) {
			return got, len(want) > 0
		}
		if c.once || slices.Contains(c.fatal, got) || time.Now().After(deadline) {
			return got, false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	if len(out) == 0 {
		return []string{"(nothing)"}
	}
	return out
}

// tries is how many probes show that every one of n backends answers: with random
// selection the chance of missing one of n in 10n+10 tries is below 1e-4 for n <= 4, and
// a miss only costs another round.
func tries(n int) int { return 10*n + 10 }

// expectBackends waits until probes from c to each target are all answered, by exactly
// the pods named.
func (t *T) expectBackends(c client, tgs []target, pods ...string) {
	t.Helper()
	for _, tg := range tgs {
		t.run(check{
			what: fmt.Sprintf("%s -> %s", c, tg.name),
			want: []string{answeredBy(pods...)},
			observe: func(cl *cluster) string {
				return cl.answerRound(c, tg, tries(len(pods)), false)
			},
		})
	}
}

// expectSeenAs waits until probes from c to each target are all answered, by exactly the
// pods of seen, each seeing the client as the named address ("node-b/eth0", "external",
// "a1"; topology.Cluster.AddressName). seen is computed per target (its family may
// matter to the caller; the names do not).
func (t *T) expectSeenAs(c client, tgs []target, seen map[string]string) {
	t.Helper()
	var want []string
	for pod, src := range seen {
		want = append(want, fmt.Sprintf("%s (seen as %s)", pod, src))
	}
	for _, tg := range tgs {
		t.run(check{
			what: fmt.Sprintf("%s -> %s, source seen", c, tg.name),
			want: []string{answeredBy(want...)},
			observe: func(cl *cluster) string {
				return cl.answerRound(c, tg, tries(len(seen)), true)
			},
		})
	}
}

// resultTimeout is how long a probe that expects a refusal or silence waits: past the
// first SYN retransmission (1 s), which is when an IPv6 TCP client learns of an ICMPv6
// refusal.
const resultTimeout = echo.DefaultTimeout

// expectResult waits until three probes in a row from c to each target end in want.
func (t *T) expectResult(c client, tgs []target, want ...string) {
	t.Helper()
	for _, tg := range tgs {
		t.run(check{
			what: fmt.Sprintf("%s -> %s", c, tg.name),
			want: want,
			observe: func(cl *cluster) string {
				return cl.round(c, tg, 3, resultTimeout, false)
			},
		})
	}
}

// expectCapability waits until three probes in a row from c to each target end in what
// the capability table says the cluster's backend does (capability, with the variant
// "<proto> <family>"). allowed are the outcomes the contract permits at all: a table entry
// outside them fails the check, so that regenerating the table cannot relax the case.
func (t *T) expectCapability(capability string, allowed []string, c client, tgs []target) {
	t.Helper()
	for _, tg := range tgs {
		t.run(check{
			// The capability in the name tells this check from the case's other checks
			// of the same target (the one proving the Service programmed), so that a
			// declared difference names exactly this one.
			what:       fmt.Sprintf("%s -> %s: %s", c, tg.name, capability),
			capability: capability,
			variant:    fmt.Sprintf("%s %s", tg.proto, tg.fam()),
			allowed:    allowed,
			observe: func(cl *cluster) string {
				return cl.round(c, tg, 3, resultTimeout, false)
			},
		})
	}
}

// round probes n times and sums the outcomes up (summarize).
func (cl *cluster) round(c client, tg target, n int, timeout time.Duration, seen bool) string {
	tokens := make([]string, 0, n)
	for range n {
		tokens = append(tokens, cl.token(cl.probe(c, tg, timeout), seen))
	}
	return summarize(tokens)
}

// answerRound is round for probes that expect an answer. A try that times out is made
// again once, and its second outcome counts: on a 2-core machine with other work, a lone
// connection now and then gets no answer within answerTimeout (the echo server or the
// client not scheduled in time), in every proxy alike, and a round of forty tries would
// then fail for reasons that say nothing about the proxy. A proxy that drops connections
// still fails it: a rule that sends one connection in k into a black hole times out both
// tries of some try in a round with probability about 40/k².
func (cl *cluster) answerRound(c client, tg target, n int, seen bool) string {
	tokens := make([]string, 0, n)
	for range n {
		out := cl.probe(c, tg, 0)
		if out.Result == echo.Timeout {
			out = cl.probe(c, tg, 0)
		}
		tokens = append(tokens, cl.token(out, seen))
	}
	return summarize(tokens)
}

// byCluster holds one value per cluster, for state a case keeps across checks (a UDP
// socket, an open connection).
type byCluster[V any] struct {
	mu sync.Mutex
	m  map[*cluster]V
}

func (b *byCluster[V]) set(cl *cluster, v V) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[*cluster]V{}
	}
	b.m[cl] = v
}

func (b *byCluster[V]) get(cl *cluster) V {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[cl]
}
