// Command scale is sluice's end-to-end scale benchmark: it measures sluice and upstream
// kube-proxy side by side, in one run, on one control plane and one dataset, the way
// /work/shared/docs/baseline.md measured upstream, and checks the goals of baseline.md and
// issue 14 (docs/benchmarks.md holds the figures).
//
//	go run ./hack/scale                                  # everything: about 2 h 30 min on 2 cores
//	go run ./hack/scale -sizes 100,1000 -iptables-sizes '' -churn-size 1000 -resyncs 0   # quick
//	go run ./hack/scale -sizes '' -iptables-sizes '' -churn-runs sluice@10ms,sluice@25ms   # churn only
//	go run ./hack/scale -report results.json [-markdown]  # the tables of an earlier run
//
// It needs root. It re-executes itself in a private network namespace (as
// test/netnstest does for kernel tests), which plays the machine's namespace: etcd and
// kube-apiserver (test/framework/controlplane) listen there, on an address added to its
// loopback, and every proxy runs in a node namespace of a fresh test/topology cluster of
// its own (one node, three pods running the echo server), so no run sees another's rules
// and each proxy is alone on its node.
//
// The dataset is written through the API, with many concurrent requests (kube-apiserver's
// priority and fairness and in-flight limits lifted), before any proxy starts: N ClusterIP
// Services of one TCP port, each with one EndpointSlice of E endpoints (addresses in
// 100.64.0.0/10 that nothing answers), plus one sentinel Service whose only endpoint is a
// real pod. It grows through the sizes of -sizes (nftables runs), -iptables-sizes and
// -churn-size, smallest first; each size is measured before the next is written. At each
// size a bare client times listing it (LIST from the watch cache, decoding, watch-list).
//
// For each proxy (sluice, kube-proxy) and mode (nftables; iptables with the legacy
// flavour; iptables with the nf_tables flavour), the flavour being chosen by what
// `iptables` is on the proxy's PATH, a run measures:
//
//   - cold: process start until the sentinel answers through its ClusterIP, probed every
//     50 ms from a pod; the part until the proxy logged that it had every Service and
//     EndpointSlice (the API side) and the rest (its own); when its first sync shows in
//     its metrics, its CPU time, and that sync's time by its own histogram;
//   - one endpoint change: the sentinel's EndpointSlice is patched to the other pod, and
//     the time until the first answer from that pod is taken (several times, median),
//     with the proxy's kubeproxy_sync_proxy_rules_duration_seconds delta for the change;
//     the same sync time for one endpoint of a bulk Service;
//   - first-packet latency: connect() time to the ClusterIP from a pod, many samples,
//     interleaved with connects straight to the pod, median and p99;
//   - memory: the run goes on until sluice has made -resyncs periodic full resyncs
//     (nftables; others get the same time), then VmHWM of the proxy (the whole run's
//     peak), VmRSS, and the largest VmHWM of the programs it ran (nft, iptables-restore);
//   - the ruleset's size (chains, rules, set/map elements) as nft or iptables-save list it;
//   - iptables modes: the floor, an iptables-restore --noflush of one chain into the table
//     the proxy left.
//
// The churn runs (-churn-runs, at -churn-size, nftables) start each proxy with a given
// minSyncPeriod on a fresh node, change endpoints of random Services in the background at
// each of -churn-rates, and flip single-endpoint probe Services between two pods, timing
// each flip from the API update to the first new connection from the node that the new pod
// answers; they record the proxy's syncs, CPU and kubeproxy_network_programming_duration_seconds
// over each rate, and the syncs a burst of changes takes.
//
// Results go to a table on stdout and to JSON (-json). Absolute times depend on the
// machine's load (recorded per run); ratios of sluice to upstream from one run are what
// docs/benchmarks.md reports.
package main
