// Package conformance is the real-packet conformance suite every sluice backend must pass,
// with upstream kube-proxy as the reference.
//
// The suite lives in files built with the conformance tag; see README.md for the topology,
// how to run it (`make test-conformance`, or `go test -tags conformance ./test/conformance
// -proxies=sluice/nftables,kube-proxy/nftables`), how to add a case, how runs are compared
// with upstream's (package results, differences.yaml), and the capability table, generated
// from the runs, that says where backends legitimately differ.
package conformance
