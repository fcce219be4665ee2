// Package conntrack holds what sluice does to the kernel's connection tracking, whatever
// the backend: the conntrack sysctls every mode sets at start (ApplySysctls), the
// Reconciler that deletes stale entries of UDP and SCTP Services after a sync, and the
// Monitor that reads how full the table is and the kernel's conntrack statistics (the
// sluice_conntrack_* metrics, `sluice status`).
//
// A connection-less protocol keeps its conntrack entry as long as packets keep coming, and
// every packet of an entry follows the NAT decided for its first one. When a Service's
// endpoint goes away, a client that keeps sending (DNS resolvers, statsd, syslog) would
// keep reaching the dead address for ever; when a Service gets its first endpoint, packets
// sent while it had none keep missing it. The Reconciler removes those entries so that
// the next packet is NATed afresh. TCP needs none of this: a dead endpoint resets or times
// out the connection, and the client opens a new one. See README.md.
package conntrack
