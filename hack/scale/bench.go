package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/topology"
)

// apiAddress is where kube-apiserver listens: an address on the loopback of this
// program's private namespace. Each run's node reaches it through its topology's bridge
// (a route added in the node), so one control plane serves every run.
var apiAddress = netip.MustParseAddr("169.254.250.1")

// bench is one invocation: the control plane, the dataset and the results so far.
type bench struct {
	o      *options
	cp     *controlplane.ControlPlane
	kube   kubernetes.Interface
	data   *dataset
	report *Report
	// seq numbers the nodes, runSeq the runs (their log directories).
	seq    int
	runSeq int
	// churnState is which bulk Services churn has given an extra endpoint.
	churnState *churnState
	// bulkMoves counts the moves of bulk Services' endpoints, to pick a Service and a new
	// address for each.
	bulkMoves int
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s scale: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// inside runs the benchmark; the process is in its private network namespace.
func inside(o *options) int {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	b := &bench{o: o, report: newReport(o)}
	err := b.run(ctx)
	b.report.Finished = time.Now()
	b.report.LoadAvgEnd = loadAvg()
	b.report.summarise()
	if werr := b.report.writeJSON(o.jsonPath); werr != nil {
		logf("writing %s: %v", o.jsonPath, werr)
	}
	b.report.printTable(os.Stdout)
	fmt.Printf("\nresults: %s\nlogs:    %s\n", o.jsonPath, filepath.Join(o.outDir, "logs"))
	if b.cp != nil {
		if err := b.cp.Stop(); err != nil {
			logf("stopping the control plane: %v", err)
		}
	}
	if err != nil {
		logf("%v", err)
		return 1
	}
	return 0
}

func (b *bench) run(ctx context.Context) error {
	o := b.o
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", apiAddress.String() + "/32", "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	if err := topology.Teardown(); err != nil {
		logf("removing leftovers of earlier topology runs: %v", err)
	}
	logf("starting etcd and kube-apiserver on %s", apiAddress)
	cp, err := controlplane.Start(ctx, controlplane.Options{
		BindAddress:         apiAddress.String(),
		LogDir:              filepath.Join(o.outDir, "logs", "controlplane"),
		ExtraAPIServerFlags: apiServerFlags,
	})
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	b.cp = cp
	b.report.ControlPlaneStartSeconds = cp.Timings().Start.Seconds()
	cfg := cp.AdminRESTConfig()
	cfg.QPS, cfg.Burst = 5000, 10000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	if b.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	serviceRange, err := netip.ParsePrefix(cp.ServiceCIDRs()[0])
	if err != nil {
		return fmt.Errorf("the control plane's Service range: %w", err)
	}
	ips := clusterIPs{base: serviceRange}
	if n := o.largestSize(); n > ips.maxBulk() {
		return fmt.Errorf("%d Services do not fit in the Service range %s (at most %d)", n, serviceRange, ips.maxBulk())
	}
	b.data = &dataset{kube: b.kube, clusterIPs: ips, endpoints: o.endpoints, workers: o.createWorkers, logf: logf}
	if err := b.data.setup(ctx); err != nil {
		return err
	}
	logf("sentinel Service %s/%s at %s", sentinelNamespace, sentinelName, b.data.SentinelAddr())

	plan := o.plan()
	if len(plan) == 0 {
		return errors.New("nothing to run: no size has a proxy/mode pair (-proxies x -modes minus -skip) or churn runs")
	}
	if slices.ContainsFunc(plan, func(p sizePlan) bool { return p.churn }) {
		shipped, err := readShippedConfig(o.shippedConfig)
		if err != nil {
			return fmt.Errorf("-shipped-config: %w", err)
		}
		b.report.Shipped = &shipped
	}
	for _, step := range plan {
		previous := b.data.bulk
		cpuBefore, _ := b.data.apiserverCPU()
		took, err := b.data.grow(ctx, step.services)
		if err != nil {
			return fmt.Errorf("writing the dataset: %w", err)
		}
		if took > 0 {
			logf("dataset: %d Services x %d endpoints (+ sentinel) written in %.1fs", step.services, o.endpoints, took.Seconds())
			b.report.Datasets = append(b.report.Datasets, DatasetStep{Services: step.services, Endpoints: o.endpoints,
				WriteSeconds: took.Seconds(), Objects: 2 * (step.services - previous)})
			if cpu, err := b.data.apiserverCPU(); err == nil && cpuBefore > 0 {
				b.report.Datasets[len(b.report.Datasets)-1].APIServerCPUSeconds = cpu - cpuBefore
			}
		}
		if api, err := b.timeAPIList(ctx, step.services); err != nil {
			logf("timing the API list at %d: %v", step.services, err)
		} else {
			b.report.APILists = append(b.report.APILists, api)
			logf("API at %d Services: LIST %.2fs (%.1f MB protobuf), decoding %.2fs, watch-list %.2fs",
				step.services, api.ListSeconds, float64(api.ListBytes)/1e6, api.DecodeSeconds, api.WatchListSeconds)
		}
		for rep := 1; rep <= o.repeat; rep++ {
			for _, r := range step.runs {
				if err := ctx.Err(); err != nil {
					return err
				}
				b.record(b.measure(ctx, r, step.services, rep, false))
			}
		}
		if step.churn {
			if err := b.churnRuns(ctx, step.services); err != nil {
				return fmt.Errorf("churn: %w", err)
			}
		}
	}
	// Profiled runs come last, apart from the measured ones: profiling costs CPU.
	if o.profile {
		for _, r := range runSpecs(o.proxies, o.modes, o.skip) {
			if r.Proxy != proxySluice {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			b.record(b.measure(ctx, r, b.data.bulk, 1, true))
		}
	}
	return nil
}

// apiServerFlags lift kube-apiserver's limits for a benchmark that writes 100 000 objects
// with many concurrent requests and has proxies list them all: no request is queued by
// priority and fairness or the in-flight limits, and a LIST may take longer than the
// default minute on a loaded machine.
var apiServerFlags = []string{
	"--enable-priority-and-fairness=false",
	"--max-requests-inflight=0",
	"--max-mutating-requests-inflight=0",
	"--request-timeout=10m",
}

func (b *bench) record(res RunResult) {
	b.report.Runs = append(b.report.Runs, res)
	logf("%s", res.oneLine())
	// A partial report survives an interrupted run.
	_ = b.report.writeJSON(b.o.jsonPath)
}

// measure runs one proxy on a fresh node and measures it; a profiled run also takes
// sluice's CPU profile of the cold start and heap profiles. A failure is recorded in the
// result, never fatal to the benchmark.
func (b *bench) measure(ctx context.Context, r runSpec, size, rep int, profiled bool) RunResult {
	b.runSeq++
	res := RunResult{Proxy: r.Proxy, Mode: r.Mode, Services: size, Endpoints: b.o.endpoints, Repeat: rep,
		Profiled: profiled, Started: time.Now(), LoadAvgStart: loadAvg()}
	name := fmt.Sprintf("%02d-%s-%s-%d", b.runSeq, r.Proxy, r.Mode, size)
	if profiled {
		name += "-profiled"
	}
	logf("=== run %s", name)
	res.Error = runIsolated(ctx, name, func(tb *programTB) error { return b.measureOn(ctx, tb, r, name, &res) })
	res.LoadAvgEnd = loadAvg()
	res.WallSeconds = time.Since(res.Started).Seconds()
	return res
}

// runIsolated runs f with a programTB of its own, whose cleanups (the node, the proxy) run
// when f returns, and returns the error f returned or unwound with as text ("" for none).
func runIsolated(ctx context.Context, name string, f func(tb *programTB) error) string {
	tb := newProgramTB(ctx, name, logf)
	defer tb.close()
	var ferr error
	if err := catchFatal(func() { ferr = f(tb) }); err != nil {
		return err.Error()
	}
	if ferr != nil {
		return ferr.Error()
	}
	return ""
}

// node is the fresh node of one run: a one-node topology whose three pods run the echo
// server (a client, and the two pods endpoints move between), registered as a Node
// object, with the sentinel pointed at podA.
type node struct {
	host               *topology.Node
	name               string
	client, podA, podB *topology.Pod
	logDir             string
}

// newNode builds a node for run name; tb's cleanups tear it down.
func (b *bench) newNode(ctx context.Context, tb *programTB, logDir string) (*node, error) {
	b.seq++
	topo := topology.New(tb, topology.Options{Nodes: 1, PodsPerNode: 3, LogDir: logDir})
	h := topo.Nodes[0]
	n := &node{host: h, name: fmt.Sprintf("scale-node-%02d", b.seq), client: h.Pods[0], podA: h.Pods[1], podB: h.Pods[2], logDir: logDir}
	if err := exec.Command("ip", "-n", h.NetNS, "route", "add", apiAddress.String()+"/32", "via", topo.APIPrefix.Addr().String()).Run(); err != nil {
		return nil, fmt.Errorf("route to the apiserver in %s: %w", h.NetNS, err)
	}
	if err := b.registerNode(ctx, n.name, h); err != nil {
		return nil, err
	}
	tb.Cleanup(func() {
		_ = b.kube.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
	})
	topo.StartEcho(tb, topology.EchoOptions{Binary: b.o.echoServer, Ports: []uint16{echoPort}, Protocols: []echo.Protocol{echo.TCP}})
	if err := b.data.pointSentinel(ctx, n.podA.IPv4, n.name); err != nil {
		return nil, err
	}
	if out := n.client.Probe(echo.TCP, b.data.SentinelAddr(), echo.ProbeOptions{Timeout: 300 * time.Millisecond}); out.Result == echo.Answered {
		return nil, fmt.Errorf("the sentinel answers before any proxy runs (%s): the node is not fresh", out)
	}
	return n, nil
}

// proxyRun is a proxy process running on a node.
type proxyRun struct {
	spec       runSpec
	proc       *topology.Process
	pid        int
	start      time.Time
	base       string // http://node:metricsPort
	metricsURL string
	// debug fetches the debug pages (pprof), which sluice serves to loopback clients only:
	// its connections are opened inside the node's namespace, to debugBase on 127.0.0.1.
	debug     *http.Client
	debugBase string
}

// startProxy writes the proxy's configuration into the node's log directory and starts
// it in the node's namespace.
func (b *bench) startProxy(n *node, r runSpec, s proxySettings) (*proxyRun, error) {
	o := b.o
	s.Mode, s.Node, s.Kubeconfig, s.Verbosity = r.configMode(), n.name, b.cp.ProxyKubeconfig(), o.proxyV
	cfgPath := filepath.Join(n.logDir, "proxy.yaml")
	if err := os.WriteFile(cfgPath, []byte(proxyConfig(s)), 0o644); err != nil {
		return nil, err
	}
	path, err := flavourPATH(filepath.Join(o.outDir, "bin"), r)
	if err != nil {
		return nil, err
	}
	bin := o.sluiceBin
	if r.Proxy == proxyUpstream {
		bin = o.kubeProxyBin
	}
	args := []string{"PATH=" + path}
	if r.Mode != modeNFTables {
		args = append(args, xtablesLockEnv(n.logDir))
	}
	if r.Proxy == proxySluice {
		args = append(args, o.sluiceEnv...)
	}
	args = append(args, bin, "--config", cfgPath, "--hostname-override", n.name, "--kubeconfig", b.cp.ProxyKubeconfig())
	base := fmt.Sprintf("http://%s", netip.AddrPortFrom(n.host.APIAddress, metricsPort))
	pr := &proxyRun{spec: r, start: time.Now(), base: base, metricsURL: base + "/metrics",
		debug: clientInNetns(&n.host.Host), debugBase: fmt.Sprintf("http://127.0.0.1:%d", metricsPort)}
	if pr.proc, err = n.host.Start("proxy", "/usr/bin/env", args...); err != nil {
		return nil, err
	}
	pr.pid = pr.proc.Pid()
	return pr, nil
}

// exited returns an error quoting the proxy's log once it has exited.
func (pr *proxyRun) exited() error {
	if done, err := pr.proc.Exited(); done {
		return fmt.Errorf("the proxy exited (%w); last lines of %s:\n%s", err, pr.proc.LogPath, logTail(pr.proc.LogPath, 30))
	}
	return nil
}

// waitCold waits until the sentinel answers through its ClusterIP from the node's client
// pod, and fills cold with what the cold start took.
func (b *bench) waitCold(ctx context.Context, n *node, pr *proxyRun, cold *ColdResult) error {
	o := b.o
	at, probes, err := waitAnswer(ctx, n.client, b.data.SentinelAddr(), n.podA.Name, o.probeInterval, o.coldTimeout, pr.exited)
	cold.Probes = probes
	if cpu, cerr := cpuOf(pr.pid); cerr == nil {
		cold.CPUSeconds, cold.ChildCPUSeconds = cpu.Total(), cpu.Children
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			cold.TimedOut = true
			return fmt.Errorf("cold start: the sentinel did not answer within %s; last lines of %s:\n%s", o.coldTimeout, pr.proc.LogPath, logTail(pr.proc.LogPath, 15))
		}
		return fmt.Errorf("cold start: %w", err)
	}
	cold.SentinelSeconds = at.Sub(pr.start).Seconds()
	cold.RSSBytesAtReady, _ = statusBytes(pr.pid, "VmRSS")
	cold.PeakRSSBytes, _ = statusBytes(pr.pid, "VmHWM")
	return nil
}

func (b *bench) measureOn(ctx context.Context, tb *programTB, r runSpec, name string, res *RunResult) error {
	o := b.o
	// Ends the helpers of this run (metrics watcher, profiles) when it returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n, err := b.newNode(ctx, tb, filepath.Join(o.outDir, "logs", name))
	if err != nil {
		return err
	}
	res.Node = n.name
	client, podA, podB := n.client, n.podA, n.podB
	pr, err := b.startProxy(n, r, proxySettings{SyncPeriod: o.syncPeriod})
	if err != nil {
		return err
	}
	res.LogPath = pr.proc.LogPath
	defer pr.proc.Stop()
	pid, metricsURL, start := pr.pid, pr.metricsURL, pr.start
	debug, base := pr.debug, pr.debugBase
	helpers := startHelperSampler(pid, 100*time.Millisecond)
	defer helpers.Stop()

	var (
		profiles sync.WaitGroup
		profMu   sync.Mutex
	)
	addProfile := func(p string) {
		profMu.Lock()
		res.Profiles = append(res.Profiles, p)
		profMu.Unlock()
	}
	defer profiles.Wait()
	if res.Profiled {
		profiles.Add(1)
		go func() {
			defer profiles.Done()
			// The metrics server comes up before the first sync starts.
			for time.Since(start) < o.coldTimeout {
				if _, err := scrape(ctx, metricsURL); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			// Idle time is not in a CPU profile: a window longer than the cold start costs
			// nothing but the wait, and the few endpoint moves in it take milliseconds.
			p := filepath.Join(o.outDir, name+".cold.cpu.pprof")
			secs := int(o.profileWindow.Seconds())
			if err := fetch(ctx, debug, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, secs), p, o.profileWindow+30*time.Second); err != nil {
				logf("cold CPU profile: %v", err)
				return
			}
			addProfile(p)
		}()
	}
	firstSync := watchFirstSync(ctx, metricsURL, start, o.coldTimeout)

	// Cold start.
	cold := &ColdResult{}
	res.Cold = cold
	if err := b.waitCold(ctx, n, pr, cold); err != nil {
		res.PeakRSSBytes, _ = statusBytes(pid, "VmHWM")
		res.HelperPeakRSSBytes, res.HelperName = helpers.Peak()
		return err
	}
	coldDone := time.Now()
	logf("%s: sentinel answered after %.2fs", name, cold.SentinelSeconds)
	if fs := <-firstSync; fs.err != nil {
		cold.Note = fs.err.Error()
	} else {
		cold.FirstSyncSeconds = fs.at.Sub(start).Seconds()
		cold.FirstSyncOwnSeconds = fs.hist.Sum
		cold.FirstSyncCount = int(fs.hist.Count)
	}
	if m, err := scrape(ctx, metricsURL); err == nil {
		if v, ok := m.sum(metricServicesFailed, ipv4); ok {
			failed := int(v)
			res.ServicesFailed = &failed
		}
		cold.FullSyncs = int(m.histogram(metricSyncFullDuration).Count)
	}
	if res.Profiled {
		p := filepath.Join(o.outDir, name+".after-cold.heap.pprof")
		if err := fetch(ctx, debug, base+"/debug/pprof/heap?gc=1", p, 30*time.Second); err == nil {
			addProfile(p)
		}
	}

	// One endpoint change, repeated. A profiled run makes more of them, under a CPU
	// profile of their own (Go takes one CPU profile at a time: the cold one ends first).
	changes, gap := o.changes, o.changeGap
	if res.Profiled {
		profiles.Wait()
		changes, gap = o.profileChanges, 1500*time.Millisecond
		window := time.Duration(changes)*(gap+time.Second) + 2*time.Second
		profiles.Add(1)
		go func() {
			defer profiles.Done()
			p := filepath.Join(o.outDir, name+".changes.cpu.pprof")
			if err := fetch(ctx, debug, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, int(window.Seconds())), p, window+30*time.Second); err != nil {
				logf("endpoint-change CPU profile: %v", err)
				return
			}
			addProfile(p)
		}()
	}
	current, other := podA, podB
	for i := 0; i < changes; i++ {
		if err := sleepCtx(ctx, gap); err != nil {
			return err
		}
		ch, err := b.moveSentinel(ctx, client, current, other, n.name, metricsURL, pr.exited)
		res.Changes = append(res.Changes, ch)
		if err != nil {
			return fmt.Errorf("endpoint change %d: %w", i+1, err)
		}
		current, other = other, current
	}
	if current != podA {
		if err := sleepCtx(ctx, gap); err != nil {
			return err
		}
		if _, err := b.moveSentinel(ctx, client, current, podA, n.name, metricsURL, pr.exited); err != nil {
			return fmt.Errorf("moving the sentinel back: %w", err)
		}
	}

	// One endpoint of a Service of -endpoints moves. Nothing answers at those addresses, so
	// only the proxy's own sync time tells.
	for i := 0; i < o.changes; i++ {
		if err := sleepCtx(ctx, gap); err != nil {
			return err
		}
		ch, err := b.moveBulk(ctx, metricsURL)
		res.BulkChanges = append(res.BulkChanges, ch)
		if err != nil {
			return fmt.Errorf("endpoint change %d of %s: %w", i+1, ch.Service, err)
		}
	}

	// First packet.
	if o.firstPacketSamples > 0 {
		via, direct, failures, err := firstPacketSamples(client, b.data.SentinelAddr(), netip.AddrPortFrom(podA.IPv4, echoPort), o.firstPacketSamples)
		if err != nil {
			return fmt.Errorf("first-packet latency: %w", err)
		}
		res.FirstPacket = &FirstPacketResult{ClusterIP: distributionOf(via), Direct: distributionOf(direct), Failures: failures}
	}

	// Periodic resyncs, so that the peak RSS covers them.
	if err := b.waitResyncs(ctx, pr, coldDone, cold.FullSyncs, res); err != nil {
		return err
	}

	// Syncs over the run, memory, CPU, ruleset.
	if m, err := scrape(ctx, metricsURL); err == nil {
		res.Syncs = int(m.histogram(metricSyncDuration).Count)
		res.FullSyncs = int(m.histogram(metricSyncFullDuration).Count)
	}
	res.PeakRSSBytes, _ = statusBytes(pid, "VmHWM")
	res.RSSBytesAtEnd, _ = statusBytes(pid, "VmRSS")
	res.HelperPeakRSSBytes, res.HelperName = helpers.Peak()
	if cpu, err := cpuOf(pid); err == nil {
		res.CPUSeconds, res.ChildCPUSeconds = cpu.Total(), cpu.Children
	}
	if res.Profiled {
		p := filepath.Join(o.outDir, name+".end.heap.pprof")
		if err := fetch(ctx, debug, base+"/debug/pprof/heap", p, 30*time.Second); err == nil {
			addProfile(p)
		}
	}
	if at, err := informersSynced(pr.proc.LogPath, r.Proxy, start); err != nil {
		cold.Note = strings.TrimPrefix(cold.Note+"; "+err.Error(), "; ")
	} else {
		cold.InformersSyncedSeconds = at.Seconds()
	}
	saveTo := ""
	if o.saveRulesets {
		saveTo = filepath.Join(n.logDir, "ruleset.txt")
	}
	size := listRuleset(ctx, n.host.NetNS, r, o.listTimeout, saveTo)
	res.Ruleset = &size
	if err := pr.exited(); err != nil {
		return err
	}
	// The floor of an iptables mode is measured on the table the proxy left, with the
	// proxy stopped so that nothing else holds the lock or competes for the CPU.
	if r.Mode != modeNFTables && o.floorRepeat > 0 {
		pr.proc.Stop()
		floor, err := measureRestoreFloor(ctx, n.host.NetNS, xtablesLockEnv(n.logDir), r, o.floorRepeat)
		res.Floor = floor
		if err != nil {
			return fmt.Errorf("iptables-restore floor: %w", err)
		}
	}
	return nil
}

// waitResyncs keeps the run going until the proxy has made o.resyncs periodic full
// resyncs after its cold start (fullAtCold full syncs then). sluice in nftables mode
// resyncs every syncPeriod; upstream v1.37 (and sluice in iptables mode) only every hour
// (syncPeriod is their retry interval), so they are given the time sluice would need,
// o.resyncs syncPeriods and ten seconds after the cold start, and their count is recorded.
func (b *bench) waitResyncs(ctx context.Context, pr *proxyRun, coldDone time.Time, fullAtCold int, res *RunResult) error {
	period, _ := time.ParseDuration(b.o.syncPeriod)
	if b.o.resyncs == 0 || period <= 0 {
		return nil
	}
	window := time.Duration(b.o.resyncs)*period + 10*time.Second
	periodic := pr.spec.Proxy == proxySluice && pr.spec.Mode == modeNFTables
	limit := window + period + time.Minute
	for {
		if err := pr.exited(); err != nil {
			return err
		}
		if m, err := scrape(ctx, pr.metricsURL); err == nil {
			res.PeriodicFullSyncs = int(m.histogram(metricSyncFullDuration).Count) - fullAtCold
		}
		since := time.Since(coldDone)
		switch {
		case periodic && res.PeriodicFullSyncs >= b.o.resyncs:
			return nil
		case !periodic && since >= window:
			return nil
		case since >= limit:
			logf("only %d periodic full resyncs within %s of the cold start", res.PeriodicFullSyncs, limit)
			return nil
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

// moveSentinel moves the sentinel's endpoint from one pod to the other and measures until
// traffic follows, and the proxy's own sync time for it.
func (b *bench) moveSentinel(ctx context.Context, client, from, to *topology.Pod, nodeName, metricsURL string, exited func() error) (ChangeResult, error) {
	ch := ChangeResult{From: from.Name, To: to.Name}
	before, err := scrape(ctx, metricsURL)
	if err != nil {
		return ch, err
	}
	hBefore := before.histogram(metricSyncDuration)
	pBefore := before.histogram(metricSyncPartialDuration)
	start := time.Now()
	if err := b.data.pointSentinel(ctx, to.IPv4, nodeName); err != nil {
		return ch, err
	}
	ch.APIWriteSeconds = time.Since(start).Seconds()
	at, _, err := waitAnswer(ctx, client, b.data.SentinelAddr(), to.Name, b.o.changeProbeInterval, time.Minute, exited)
	if err != nil {
		ch.TimedOut = errors.Is(err, context.DeadlineExceeded)
		return ch, err
	}
	ch.VisibleSeconds = at.Sub(start).Seconds()
	// The sync is observed just after the rules are written; wait for it to show.
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err := scrape(ctx, metricsURL)
		if err != nil {
			return ch, err
		}
		d := after.histogram(metricSyncDuration).minus(hBefore)
		if d.Count >= 1 || time.Now().After(deadline) {
			p := after.histogram(metricSyncPartialDuration).minus(pBefore)
			ch.SyncSeconds, ch.SyncCount, ch.PartialSyncCount = changeSync(d, p), int(d.Count), int(p.Count)
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

// moveBulk moves one endpoint of a bulk Service (a different one each time) and waits for
// the proxy's sync to show in its metrics.
func (b *bench) moveBulk(ctx context.Context, metricsURL string) (BulkChangeResult, error) {
	b.bulkMoves++
	i := (b.bulkMoves * 7919) % b.data.bulk // spread over the dataset
	ch := BulkChangeResult{Service: datasetNamespace + "/" + bulkName(i)}
	before, err := scrape(ctx, metricsURL)
	if err != nil {
		return ch, err
	}
	h, p := before.histogram(metricSyncDuration), before.histogram(metricSyncPartialDuration)
	start := time.Now()
	if err := b.data.moveBulkEndpoint(ctx, i, b.bulkMoves); err != nil {
		return ch, err
	}
	ch.APIWriteSeconds = time.Since(start).Seconds()
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, err := scrape(ctx, metricsURL)
		if err != nil {
			return ch, err
		}
		if d := after.histogram(metricSyncDuration).minus(h); d.Count >= 1 {
			ch.SyncSeconds, ch.SyncCount = changeSync(d, after.histogram(metricSyncPartialDuration).minus(p)), int(d.Count)
			ch.SeenSeconds = time.Since(start).Seconds()
			return ch, nil
		}
		if time.Now().After(deadline) {
			return ch, fmt.Errorf("no sync within 30s")
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return ch, err
		}
	}
}

// changeSync is the sync time of a change from the deltas of the sync histogram (all) and
// of the partial one: when a periodic full resync fell in the window too, the partial
// syncs alone are the change's.
func changeSync(all, partial histogram) float64 {
	if partial.Count >= 1 && partial.Count < all.Count {
		return partial.mean()
	}
	return all.mean()
}

// registerNode creates the Node object the proxy runs as, as kubelet would: InternalIP
// the node's underlay address, podCIDR from the topology, Ready.
func (b *bench) registerNode(ctx context.Context, name string, n *topology.Node) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Spec:       corev1.NodeSpec{PodCIDR: n.PodCIDRs[0].String(), PodCIDRs: []string{n.PodCIDRs[0].String()}},
	}
	created, err := b.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Node %s: %w", name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.IPv4.String()},
		{Type: corev1.NodeHostName, Address: name},
	}
	created.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "ScaleBenchmark",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}
	if _, err := b.kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting Node %s status: %w", name, err)
	}
	return nil
}

// firstSync is when the proxy's first sync showed in its metrics.
type firstSync struct {
	at   time.Time
	hist histogram
	err  error
}

// watchFirstSync scrapes the proxy's metrics every 100ms until its sync histogram has an
// observation, and sends the time it was first seen: the proxy's own "everything
// programmed", which may come after the sentinel answers if the proxy writes Services in
// several transactions.
func watchFirstSync(ctx context.Context, url string, start time.Time, timeout time.Duration) <-chan firstSync {
	ch := make(chan firstSync, 1)
	go func() {
		for {
			if m, err := scrape(ctx, url); err == nil {
				if h := m.histogram(metricSyncDuration); h.Count >= 1 {
					ch <- firstSync{at: time.Now(), hist: h}
					return
				}
			}
			if time.Since(start) > timeout {
				ch <- firstSync{err: fmt.Errorf("no sync in the proxy's metrics within %s", timeout)}
				return
			}
			if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
				ch <- firstSync{err: err}
				return
			}
		}
	}()
	return ch
}

// fetch saves url to path.
// clientInNetns returns an HTTP client whose connections are opened in host's namespace
// (a socket stays in the namespace it was made in, whichever thread uses it later).
func clientInNetns(host *topology.Host) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := host.Do(func() error {
				var err error
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
}

func fetch(ctx context.Context, client *http.Client, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close() // the copy's error is the one to report
		return err
	}
	return f.Close()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// noise are log lines that say nothing about a proxy's progress: upstream logs these on
// every metrics scrape on a kernel without nfacct.
var noise = []string{"failed to collect nfacct counter"}

// logTail returns the last n lines of a log, leaving out noise.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if !slices.ContainsFunc(noise, func(s string) bool { return strings.Contains(line, s) }) {
			lines = append(lines, line)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
