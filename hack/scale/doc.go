// Command scale is sluice's end-to-end scale benchmark: it measures sluice and upstream
// kube-proxy side by side, in one run, on one control plane and one dataset, the way
// /work/shared/docs/baseline.md measured upstream.
//
//	go run ./hack/scale                       # full run: 10 000 Services x 10 endpoints
//	go run ./hack/scale -services 1000        # quick, CI-sized
//	go run ./hack/scale -proxies sluice -modes nftables -services 1000 -small-sizes ''
//
// It needs root. It re-executes itself in a private network namespace (as
// test/netnstest does for kernel tests), which plays the machine's namespace: etcd and
// kube-apiserver (test/framework/controlplane) listen there, on an address added to its
// loopback, and every proxy runs in a node namespace of a fresh test/topology cluster of
// its own (one node, three pods running the echo server), so no run sees another's rules.
//
// The dataset is written once, before any proxy starts, with many concurrent admin
// requests: N ClusterIP Services of one TCP port, each with one EndpointSlice of E
// endpoints (addresses in 100.64.0.0/10 that nothing answers), plus one sentinel Service
// whose only endpoint is a real pod. It grows from the smallest size to the largest, and
// each size is measured before the next is added.
//
// For each proxy (sluice, kube-proxy) and mode (nftables; iptables with the legacy
// flavour; iptables with the nf_tables flavour), the flavour being chosen by what
// `iptables` is on the proxy's PATH, it measures:
//
//   - cold: process start until the sentinel answers through its ClusterIP, probed every
//     50 ms from a pod; also when the proxy's own first sync shows in its metrics, its
//     CPU time at that point, and how long that sync took by its own histogram;
//   - one endpoint change: the sentinel's EndpointSlice is patched to the other pod, and
//     the time until the first answer from that pod is taken (several times, median),
//     with the proxy's kubeproxy_sync_proxy_rules_duration_seconds delta for the change;
//   - peak RSS: VmHWM of the proxy process, and the largest VmHWM of the programs it ran
//     (nft, iptables-restore), sampled while they run;
//   - the ruleset's size (chains, rules, set/map elements, text bytes) as nft or
//     iptables-save lists it;
//   - first-packet latency: connect() time to the ClusterIP from a pod, many samples,
//     interleaved with connects straight to the pod, median and p99.
//
// Results go to a table on stdout and to JSON (-json). Absolute times depend on the
// machine's load (recorded per run); ratios of sluice to upstream from one run are what
// docs/benchmarks.md reports.
package main
