// Package sandbox builds the one-command sluice sandbox (`make demo`, hack/demo.sh): a
// real etcd and kube-apiserver (test/framework/controlplane), two nodes made of network
// namespaces with pods running the echo server (test/topology), Node objects, sample
// Services and their EndpointSlices written the way the control plane's controllers would,
// and sluice running on each node in the chosen mode. It then probes every Service from a
// pod, from the other node and from an external client, prints who answered and which
// source address each pod saw, and stays up until it is closed.
//
// Everything it creates is listed in a state file in its run directory, so that
// `hack/demo.sh down` (Down) can remove it from another shell, even after the process
// that built it was killed. hack/demo/README.md describes what it builds.
package sandbox
