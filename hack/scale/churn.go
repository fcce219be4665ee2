package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/sluiceproxy/sluice/test/topology"
)

// The churn runs (issue 14, item 4): a proxy at -churn-size Services while a background
// client changes endpoints of random Services at a steady rate, and single-endpoint probe
// Services are flipped between the node's two echo pods, one at a time, each flip timed
// from the API update to the first new connection from the node that the new pod answers.

// probeNamespace holds the probe Services. Like the sentinel's, it sorts after the bulk.
const probeNamespace = "zz-scale-probes"

// churnRun is one proxy and minSyncPeriod measured under churn (-churn-runs).
type churnRun struct {
	Proxy string
	// MinSync is "default" (the proxy's own default, upstream's 1s), "shipped" (sluice's
	// deploy/base/config.conf) or a duration.
	MinSync string
}

func (c churnRun) String() string { return c.Proxy + "@" + c.MinSync }

const (
	minSyncDefault = "default"
	minSyncShipped = "shipped"
)

func parseChurnRuns(s string) ([]churnRun, error) {
	var out []churnRun
	for _, f := range splitList(s) {
		proxy, minSync, ok := strings.Cut(f, "@")
		if !ok {
			return nil, fmt.Errorf("%q: want proxy@minSyncPeriod", f)
		}
		if proxy != proxySluice && proxy != proxyUpstream {
			return nil, fmt.Errorf("%q: unknown proxy %q", f, proxy)
		}
		if minSync != minSyncDefault && minSync != minSyncShipped {
			d, err := time.ParseDuration(minSync)
			if err != nil || d < 0 {
				return nil, fmt.Errorf("%q: minSyncPeriod must be default, shipped or a duration", f)
			}
			if d == 0 {
				// KubeProxyConfiguration's defaulting turns 0 into 1s, in both proxies.
				return nil, fmt.Errorf("%q: a minSyncPeriod of 0 is defaulted to 1s; use default, or a positive duration", f)
			}
		}
		out = append(out, churnRun{Proxy: proxy, MinSync: minSync})
	}
	return out, nil
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range splitList(s) {
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || r <= 0 || r > 1000 {
			return nil, fmt.Errorf("%q: want a rate per second in (0, 1000]", f)
		}
		out = append(out, r)
	}
	return out, nil
}

// ShippedConfig is what the churn runs take from the configuration sluice ships.
type ShippedConfig struct {
	Path          string `json:"path"`
	Mode          string `json:"mode"`
	MinSyncPeriod string `json:"minSyncPeriod"`
	SyncPeriod    string `json:"syncPeriod"`
}

// readShippedConfig reads the mode and that mode's sync periods from a
// KubeProxyConfiguration file (deploy/base/config.conf).
func readShippedConfig(path string) (ShippedConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ShippedConfig{}, err
	}
	return parseShippedConfig(path, b)
}

func parseShippedConfig(path string, b []byte) (ShippedConfig, error) {
	var cfg v1alpha1.KubeProxyConfiguration
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return ShippedConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	sc := ShippedConfig{Path: path, Mode: string(cfg.Mode)}
	switch cfg.Mode {
	case "nftables":
		sc.MinSyncPeriod, sc.SyncPeriod = cfg.NFTables.MinSyncPeriod.Duration.String(), cfg.NFTables.SyncPeriod.Duration.String()
	case "iptables", "":
		sc.MinSyncPeriod, sc.SyncPeriod = cfg.IPTables.MinSyncPeriod.Duration.String(), cfg.IPTables.SyncPeriod.Duration.String()
	default:
		return sc, fmt.Errorf("%s: mode %q: the churn runs measure nftables or iptables", path, cfg.Mode)
	}
	if sc.MinSyncPeriod == "0s" && !strings.Contains(string(b), "minSyncPeriod") {
		return sc, fmt.Errorf("%s: no minSyncPeriod in the %s section", path, cfg.Mode)
	}
	return sc, nil
}

// ChurnResult is one proxy (and minSyncPeriod) under churn, on a fresh node.
type ChurnResult struct {
	Proxy string `json:"proxy"`
	// Run is the -churn-runs entry; MinSyncPeriod what the proxy ran with ("" for its
	// default).
	Run           string     `json:"run"`
	MinSyncPeriod string     `json:"minSyncPeriod"`
	Services      int        `json:"services"`
	Node          string     `json:"node"`
	LogPath       string     `json:"logPath,omitempty"`
	Started       time.Time  `json:"started"`
	WallSeconds   float64    `json:"wallSeconds"`
	LoadAvgStart  [3]float64 `json:"loadAvgStart"`
	LoadAvgEnd    [3]float64 `json:"loadAvgEnd"`
	ColdSeconds   float64    `json:"coldSeconds"`
	// Phases are the background rates, in order.
	Phases []ChurnPhase `json:"phases"`
	Burst  *BurstResult `json:"burst,omitempty"`
	// PeakRSSBytes is the proxy's VmHWM at the end (cold start and churn).
	PeakRSSBytes int64  `json:"peakRSSBytes"`
	Error        string `json:"error,omitempty"`
}

// ChurnPhase is one background rate: the flips timed under it and what the proxy did.
type ChurnPhase struct {
	Rate float64 `json:"rate"`
	// Seconds is from the first flip's start to the last flip's end, the window every
	// count below covers; BackgroundChanges the background updates the apiserver took in
	// it (BackgroundErrors failed), AchievedRate their rate.
	Seconds           float64 `json:"seconds"`
	BackgroundChanges int     `json:"backgroundChanges"`
	BackgroundErrors  int     `json:"backgroundErrors"`
	AchievedRate      float64 `json:"achievedRate"`
	// Flips are the timed flips; FlipErrors those that failed (timed out).
	Flips      []FlipResult `json:"flips"`
	FlipErrors []string     `json:"flipErrors,omitempty"`
	// Syncs, PartialSyncs and FullSyncs count the proxy's (IPv4) syncs in the window.
	Syncs        int `json:"syncs"`
	PartialSyncs int `json:"partialSyncs"`
	FullSyncs    int `json:"fullSyncs"`
	// CPUSeconds is the proxy's CPU time in the window (its own and its helpers'),
	// ChildCPUSeconds the helpers' part.
	CPUSeconds      float64 `json:"cpuSeconds"`
	ChildCPUSeconds float64 `json:"childCPUSeconds"`
	// NetworkProgramming is the proxy's kubeproxy_network_programming_duration_seconds
	// over the window: only the flips carry endpoints.kubernetes.io/last-change-trigger-time,
	// so it observes exactly them.
	NetworkProgramming histogramBuckets `json:"networkProgramming"`
}

// FlipResult is one flip of a probe Service's only endpoint to the other pod.
type FlipResult struct {
	Probe string `json:"probe"`
	To    string `json:"to"`
	// Seconds is from sending the update to starting the first connection the new pod
	// answered; AnsweredSeconds to that answer's arrival; APIWriteSeconds the update's
	// round trip.
	Seconds         float64 `json:"seconds"`
	AnsweredSeconds float64 `json:"answeredSeconds"`
	APIWriteSeconds float64 `json:"apiWriteSeconds"`
	Probes          int     `json:"probes"`
	Stale           int     `json:"stale,omitempty"`
	Unanswered      int     `json:"unanswered,omitempty"`
}

// BurstResult is a burst of endpoint changes sent as fast as the apiserver took them.
type BurstResult struct {
	Changes     int     `json:"changes"`
	Errors      int     `json:"errors"`
	SendSeconds float64 `json:"sendSeconds"`
	// Syncs is the number of syncs from the burst's start until the proxy was quiet
	// again, SettledSeconds when its last sync ended (from the burst's start).
	Syncs          int     `json:"syncs"`
	SettledSeconds float64 `json:"settledSeconds"`
}

// churnRuns measures every -churn-runs entry at size Services, each on a fresh node.
func (b *bench) churnRuns(ctx context.Context, size int) error {
	o := b.o
	shipped := *b.report.Shipped
	if err := b.data.createProbes(ctx, o.churn.probes); err != nil {
		return err
	}
	defer func() {
		if err := b.data.deleteProbes(context.Background()); err != nil {
			logf("deleting the probe Services: %v", err)
		}
	}()
	b.churnState = &churnState{extra: map[int]bool{}}
	for _, run := range o.churn.runs {
		if err := ctx.Err(); err != nil {
			return err
		}
		res := b.churnOne(ctx, run, shipped, size)
		b.report.Churn = append(b.report.Churn, res)
		logf("%s", res.oneLine())
		_ = b.report.writeJSON(o.jsonPath)
	}
	return nil
}

// churnOne runs one proxy under churn on a fresh node.
func (b *bench) churnOne(ctx context.Context, run churnRun, shipped ShippedConfig, size int) ChurnResult {
	b.runSeq++
	res := ChurnResult{Proxy: run.Proxy, Run: run.String(), Services: size, Started: time.Now(), LoadAvgStart: loadAvg()}
	switch run.MinSync {
	case minSyncDefault:
	case minSyncShipped:
		res.MinSyncPeriod = shipped.MinSyncPeriod
	default:
		res.MinSyncPeriod = run.MinSync
	}
	name := fmt.Sprintf("%02d-churn-%s-%s", b.runSeq, run.Proxy, strings.ReplaceAll(run.MinSync, ".", "_"))
	logf("=== churn run %s", name)
	res.Error = runIsolated(ctx, name, func(tb *programTB) error { return b.churnOn(ctx, tb, name, &res) })
	res.LoadAvgEnd = loadAvg()
	res.WallSeconds = time.Since(res.Started).Seconds()
	return res
}

func (b *bench) churnOn(ctx context.Context, tb *programTB, name string, res *ChurnResult) error {
	o := b.o
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n, err := b.newNode(ctx, tb, filepath.Join(o.outDir, "logs", name))
	if err != nil {
		return err
	}
	res.Node = n.name
	if err := b.data.pointProbes(ctx, n.podA.IPv4, n.name); err != nil {
		return err
	}
	pr, err := b.startProxy(n, runSpec{Proxy: res.Proxy, Mode: modeNFTables}, proxySettings{SyncPeriod: o.syncPeriod, MinSyncPeriod: res.MinSyncPeriod})
	if err != nil {
		return err
	}
	res.LogPath = pr.proc.LogPath
	defer pr.proc.Stop()
	cold := &ColdResult{}
	if err := b.waitCold(ctx, n, pr, cold); err != nil {
		return err
	}
	res.ColdSeconds = cold.SentinelSeconds
	logf("%s: sentinel answered after %.2fs", name, cold.SentinelSeconds)
	// Every probe answers from podA before the first flip.
	current := make([]*topology.Pod, o.churn.probes)
	for k := range current {
		if _, _, err := waitAnswer(ctx, n.host.Pods[0], b.data.probeAddr(k), n.podA.Name, 20*time.Millisecond, time.Minute, pr.exited); err != nil {
			return fmt.Errorf("probe Service %d: %w", k, err)
		}
		current[k] = n.podA
	}
	for i, rate := range o.churn.rates {
		phase, err := b.churnPhase(ctx, n, pr, current, rate)
		res.Phases = append(res.Phases, phase)
		if err != nil {
			return fmt.Errorf("churn at %g/s: %w", rate, err)
		}
		logf("%s: %g changes/s: %s", name, rate, phase.oneLine())
		if i < len(o.churn.rates)-1 {
			if err := sleepCtx(ctx, 2*time.Second); err != nil {
				return err
			}
		}
	}
	if o.churn.burst > 0 {
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
		burst, err := b.churnBurst(ctx, pr, res.MinSyncPeriod)
		res.Burst = &burst
		if err != nil {
			return fmt.Errorf("burst: %w", err)
		}
	}
	res.PeakRSSBytes, _ = statusBytes(pr.pid, "VmHWM")
	return pr.exited()
}

// phaseSeeds returns the seeds of a phase's two random streams (background Services, flip
// gaps): the same for every proxy at the same rate, so that all see the same churn.
func phaseSeeds(seed int64, rate float64) (background, gaps *rand.Rand) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%g", rate)
	k := h.Sum64()
	return rand.New(rand.NewPCG(uint64(seed), k)), rand.New(rand.NewPCG(uint64(seed), k^0x9e3779b97f4a7c15))
}

// churnPhase runs the background churn at rate and times o.churn.probes × o.churn.flips
// flips under it; current holds the pod each probe Service points at, and is updated.
func (b *bench) churnPhase(ctx context.Context, n *node, pr *proxyRun, current []*topology.Pod, rate float64) (ChurnPhase, error) {
	o := b.o
	phase := ChurnPhase{Rate: rate}
	backgroundRNG, gapRNG := phaseSeeds(o.churn.seed, rate)
	bg := b.startChurner(ctx, backgroundRNG, rate)
	defer bg.stop()
	if err := sleepCtx(ctx, o.churn.warmup); err != nil {
		return phase, err
	}
	before, err := scrape(ctx, pr.metricsURL)
	if err != nil {
		return phase, err
	}
	cpuBefore, err := cpuOf(pr.pid)
	if err != nil {
		return phase, err
	}
	sentBefore, errorsBefore := bg.counts()
	start := time.Now()
	flips := o.churn.probes * o.churn.flips
	for f := range flips {
		k := f % o.churn.probes
		gap := o.churn.flipGap/2 + time.Duration(gapRNG.Int64N(int64(o.churn.flipGap)+1))
		if err := sleepCtx(ctx, gap); err != nil {
			return phase, err
		}
		if err := pr.exited(); err != nil {
			return phase, err
		}
		from, to := current[k], n.podA
		if from == n.podA {
			to = n.podB
		}
		flip, err := b.flip(ctx, n, k, from, to)
		if err != nil {
			phase.FlipErrors = append(phase.FlipErrors, err.Error())
			if len(phase.FlipErrors) > max(3, flips/20) {
				return phase, fmt.Errorf("%d flips failed, last: %w", len(phase.FlipErrors), err)
			}
			// Where the probe points now is unknown: point it back and wait for it.
			if err := b.data.pointProbe(ctx, k, from.IPv4, n.name, time.Time{}); err != nil {
				return phase, err
			}
			if _, _, err := waitAnswer(ctx, n.host.Pods[0], b.data.probeAddr(k), from.Name, 20*time.Millisecond, o.churn.flipTimeout, pr.exited); err != nil {
				return phase, fmt.Errorf("probe Service %d after a failed flip: %w", k, err)
			}
			continue
		}
		phase.Flips = append(phase.Flips, flip)
		current[k] = to
	}
	phase.Seconds = time.Since(start).Seconds()
	// A proxy observes a flip's programming latency after its sync's bookkeeping, which
	// may end after traffic already follows: give the last flip's observation time to show.
	want := before.histogram(metricNetworkProgramming).Count + float64(len(phase.Flips))
	var after metrics
	for deadline := time.Now().Add(5 * time.Second); ; {
		if after, err = scrape(ctx, pr.metricsURL); err != nil {
			return phase, err
		}
		if after.histogram(metricNetworkProgramming).Count >= want || time.Now().After(deadline) {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return phase, err
		}
	}
	cpuAfter, err := cpuOf(pr.pid)
	if err != nil {
		return phase, err
	}
	sentAfter, errorsAfter := bg.counts()
	phase.BackgroundChanges, phase.BackgroundErrors = sentAfter-sentBefore, errorsAfter-errorsBefore
	phase.AchievedRate = float64(phase.BackgroundChanges) / phase.Seconds
	phase.Syncs = int(after.histogram(metricSyncDuration).minus(before.histogram(metricSyncDuration)).Count)
	phase.PartialSyncs = int(after.histogram(metricSyncPartialDuration).minus(before.histogram(metricSyncPartialDuration)).Count)
	phase.FullSyncs = int(after.histogram(metricSyncFullDuration).minus(before.histogram(metricSyncFullDuration)).Count)
	phase.CPUSeconds = cpuAfter.Total() - cpuBefore.Total()
	phase.ChildCPUSeconds = cpuAfter.Children - cpuBefore.Children
	phase.NetworkProgramming = after.buckets(metricNetworkProgramming).minus(before.buckets(metricNetworkProgramming))
	return phase, nil
}

// flip points probe Service k at to (it pointed at from), and times it from the node.
func (b *bench) flip(ctx context.Context, n *node, k int, from, to *topology.Pod) (FlipResult, error) {
	o := b.o
	res := FlipResult{Probe: probeName(k), To: to.Name}
	var wrote time.Duration
	update := func() (time.Time, error) {
		at := time.Now()
		err := b.data.pointProbe(ctx, k, to.IPv4, n.name, at)
		wrote = time.Since(at)
		return at, err
	}
	p, err := probeFlip(ctx, n.host.NetNS, b.data.probeAddr(k), to.Name, from.Name, o.churn.probeInterval, o.churn.flipTimeout, update)
	res.Probes, res.Stale, res.Unanswered = p.Probes, p.Stale, p.Unanswered
	res.APIWriteSeconds = wrote.Seconds()
	if err != nil {
		return res, fmt.Errorf("flipping %s to %s: %w", res.Probe, to.Name, err)
	}
	res.Seconds = p.FirstNew.Sub(p.Update).Seconds()
	res.AnsweredSeconds = p.FirstNewAnswered.Sub(p.Update).Seconds()
	return res, nil
}

// churnBurst sends o.churn.burst endpoint changes with many workers and counts the syncs
// the proxy needs for them.
func (b *bench) churnBurst(ctx context.Context, pr *proxyRun, minSync string) (BurstResult, error) {
	o := b.o
	res := BurstResult{Changes: o.churn.burst}
	before, err := scrape(ctx, pr.metricsURL)
	if err != nil {
		return res, err
	}
	rng, _ := phaseSeeds(o.churn.seed, -1)
	jobs := b.churnState.pick(rng, b.data.bulk, o.churn.burst)
	start := time.Now()
	var failed atomic.Int64
	var wg sync.WaitGroup
	work := make(chan churnChange)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				if err := b.data.setExtraEndpoint(ctx, c.service, c.extra); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	sent := time.Now()
	res.SendSeconds = sent.Sub(start).Seconds()
	res.Errors = int(failed.Load())
	// Quiet: a sync ended after the last change was written, and none for a while since.
	quiet := 2 * time.Second
	if d, err := time.ParseDuration(minSync); err == nil && 3*d > quiet {
		quiet = 3 * d
	}
	deadline := sent.Add(2 * time.Minute)
	lastCount, lastChange := -1, time.Now()
	for {
		m, err := scrape(ctx, pr.metricsURL)
		if err != nil {
			return res, err
		}
		count := int(m.histogram(metricSyncDuration).minus(before.histogram(metricSyncDuration)).Count)
		last, _ := m.sum(metricSyncLastTimestamp, ipv4)
		if count != lastCount {
			lastCount, lastChange = count, time.Now()
		}
		lastSync := time.Unix(0, int64(last*1e9))
		if lastSync.After(sent) && time.Since(lastChange) >= quiet {
			res.Syncs, res.SettledSeconds = count, lastSync.Sub(start).Seconds()
			return res, nil
		}
		if time.Now().After(deadline) {
			res.Syncs = count
			return res, fmt.Errorf("the proxy did not settle within 2 minutes of the burst")
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return res, err
		}
	}
}

// churnState is which bulk Services have an extra endpoint (added by churn), shared by
// every churn run of a benchmark: each change adds one to a Service without, or removes
// it from a Service with.
type churnState struct {
	mu    sync.Mutex
	extra map[int]bool
}

// churnChange is one background change: bulk Service service gets (or loses) its extra
// endpoint.
type churnChange struct {
	service int
	extra   bool
}

// pick chooses n changes on random Services among the first bulk, toggling their state.
func (s *churnState) pick(rng *rand.Rand, bulk, n int) []churnChange {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]churnChange, n)
	for i := range out {
		svc := rng.IntN(bulk)
		s.extra[svc] = !s.extra[svc]
		out[i] = churnChange{service: svc, extra: s.extra[svc]}
	}
	return out
}

// churner sends background changes at a steady rate until stopped.
type churner struct {
	cancel       context.CancelFunc
	done         chan struct{}
	sent, failed atomic.Int64
}

func (c *churner) counts() (sent, failed int) { return int(c.sent.Load()), int(c.failed.Load()) }

func (c *churner) stop() {
	c.cancel()
	<-c.done
}

// startChurner starts changing endpoints of random bulk Services rate times a second:
// a pacer picks the Service and hands the change to a pool of writers, so that a slow
// apiserver answer does not slow the rate.
func (b *bench) startChurner(ctx context.Context, rng *rand.Rand, rate float64) *churner {
	// Stopping ends the pacer; the writers finish what it handed them.
	pacer, cancel := context.WithCancel(ctx)
	c := &churner{cancel: cancel, done: make(chan struct{})}
	work := make(chan churnChange, 1024)
	var writers sync.WaitGroup
	for range 64 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for ch := range work {
				if err := b.data.setExtraEndpoint(ctx, ch.service, ch.extra); err != nil {
					if ctx.Err() == nil {
						c.failed.Add(1)
					}
					continue
				}
				c.sent.Add(1)
			}
		}()
	}
	go func() {
		defer close(c.done)
		defer writers.Wait()
		defer close(work)
		interval := time.Duration(float64(time.Second) / rate)
		next := time.Now()
		for {
			next = next.Add(interval)
			if err := sleepCtx(pacer, time.Until(next)); err != nil {
				return
			}
			for _, ch := range b.churnState.pick(rng, b.data.bulk, 1) {
				select {
				case work <- ch:
				default:
					c.failed.Add(1) // the writers are a second behind: the apiserver cannot keep up
				}
			}
		}
	}()
	return c
}

// probeName is the name of probe Service k.
func probeName(k int) string { return fmt.Sprintf("probe-%02d", k) }

// createProbes creates n single-endpoint probe Services (their EndpointSlices come with
// pointProbes).
func (d *dataset) createProbes(ctx context.Context, n int) error {
	_, err := d.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: probeNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", probeNamespace, err)
	}
	d.probes = nil
	for k := range n {
		svc, err := d.kube.CoreV1().Services(probeNamespace).Create(ctx, service(probeNamespace, probeName(k), d.clusterIPs.probe(k)), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating probe Service %d: %w", k, err)
		}
		d.probes = append(d.probes, svc)
	}
	return nil
}

// deleteProbes deletes the probe Services and their EndpointSlices (no namespace
// controller runs to delete a namespace's contents).
func (d *dataset) deleteProbes(ctx context.Context) error {
	var errs []error
	for k := range d.probes {
		if err := d.kube.CoreV1().Services(probeNamespace).Delete(ctx, probeName(k), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		if err := d.kube.DiscoveryV1().EndpointSlices(probeNamespace).Delete(ctx, probeName(k)+"-scale", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	d.probes = nil
	return errors.Join(errs...)
}

// probeAddr is probe Service k's ClusterIP and port.
func (d *dataset) probeAddr(k int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(d.probes[k].Spec.ClusterIP), servicePort)
}

// pointProbes points every probe Service at pod, with no trigger time.
func (d *dataset) pointProbes(ctx context.Context, pod netip.Addr, node string) error {
	for k := range d.probes {
		if err := d.pointProbe(ctx, k, pod, node, time.Time{}); err != nil {
			return err
		}
	}
	return nil
}

// pointProbe makes pod probe Service k's only endpoint, creating its EndpointSlice the
// first time. A non-zero trigger is written as endpoints.kubernetes.io/last-change-trigger-time,
// as the EndpointSlice controller does, for kubeproxy_network_programming_duration_seconds;
// a zero one removes it.
func (d *dataset) pointProbe(ctx context.Context, k int, pod netip.Addr, node string, trigger time.Time) error {
	eps := []discoveryv1.Endpoint{readyEndpoint(pod, node)}
	var annotation any // null removes it
	if !trigger.IsZero() {
		annotation = trigger.UTC().Format(time.RFC3339Nano)
	}
	patch, err := json.Marshal(map[string]any{
		"metadata":  map[string]any{"annotations": map[string]any{corev1.EndpointsLastChangeTriggerTime: annotation}},
		"endpoints": eps,
	})
	if err != nil {
		return err
	}
	slices := d.kube.DiscoveryV1().EndpointSlices(probeNamespace)
	name := probeName(k)
	_, err = slices.Patch(ctx, name+"-scale", types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		_, err = slices.Create(ctx, slice(probeNamespace, name, eps), metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("pointing %s at %s: %w", name, pod, err)
	}
	return nil
}

// setExtraEndpoint writes bulk Service i's endpoints: its own, plus its extra one when
// extra is set.
func (d *dataset) setExtraEndpoint(ctx context.Context, i int, extra bool) error {
	eps := d.bulkEndpoints(i)
	if extra {
		eps = append(eps, readyEndpoint(extraEndpoint(i), "fake-node-extra"))
	}
	patch, err := json.Marshal(map[string]any{"endpoints": eps})
	if err != nil {
		return err
	}
	_, err = d.kube.DiscoveryV1().EndpointSlices(datasetNamespace).Patch(ctx, bulkName(i)+"-scale", types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
