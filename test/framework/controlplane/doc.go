// Package controlplane runs a real Kubernetes control plane, etcd and kube-apiserver,
// for sluice's end-to-end tests, the conformance suite and the sandbox.
//
// Start runs etcd on loopback and kube-apiserver on Options.BindAddress (127.0.0.1 by
// default), each on a free port, with TLS, client-certificate authentication, Node and
// RBAC authorization and a service-account signing key. Every certificate is made in Go
// at start by a CA of the control plane's own. Start returns once the apiserver serves:
// /readyz is ok, the "default" and "kube-system" Namespaces and the "kubernetes" Service
// exist, and the "kubernetes" ServiceCIDR is ready.
//
// Two identities come ready-made: AdminKubeconfig/AdminClient (user admin, group
// system:masters) and ProxyKubeconfig, the user system:kube-proxy that upstream's
// bootstrap RBAC binds to ClusterRole system:node-proxier, so sluice runs with exactly
// kube-proxy's permissions. KubeconfigFor and RESTConfigFor issue any other identity.
//
// RestartAPIServer (or StopAPIServer then StartAPIServer) restarts kube-apiserver alone,
// on the same port with the same certificates, while etcd keeps the data: tests of
// sluice reconnecting use it.
//
// The binaries are built from the Go module proxy by hack/control-plane.sh and cached in
// ~/.cache/sluice/bin (about 9 minutes once); see FindBinaries. In a test:
//
//	cp := controlplane.StartForTest(t, controlplane.Options{})
//	client := cp.AdminClient()
//	// run sluice with --kubeconfig=cp.ProxyKubeconfig()
//
// Everything is torn down by Stop (StartForTest registers it with t.Cleanup): both
// process groups are killed and the temporary directory is removed. If the test binary
// dies first, the kernel kills the processes (parent-death signal).
package controlplane
