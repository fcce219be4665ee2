// Package hostnet reads and writes the network settings of the network namespace the
// process runs in (the node's, in a DaemonSet with hostNetwork): the addresses of its
// interfaces and its integer sysctls under /proc/sys.
//
// It is the one place sluice's node-side packages (the backends, the conntrack reconciler,
// the health servers) do this I/O, so that they agree on it; it imports nothing of sluice's.
// The pure parts (turning the kernel's answers into values) are tested without root.
package hostnet
