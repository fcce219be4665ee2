// Package conformance is the real-packet conformance suite every sluice backend must pass.
//
// The suite lives in files built with the conformance tag; see README.md for the topology,
// how to run it (`make test-conformance`, or `go test -tags conformance ./test/conformance
// -backend=nftables`), how to add a case, and the capability table that says where backends
// legitimately differ.
package conformance
