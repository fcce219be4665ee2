// Package model computes, for one node, what every backend must program: the Services and
// EndpointSlices of the API turned into one NodeState per IP family (see types.go, the
// contract every backend reads).
//
// The computation is pure: ComputeService handles one Service in one family, Compute the
// whole node, and the Tracker recomputes only the Services whose objects changed, between
// the informer handlers and the sync loop. Nothing here does I/O, reads a clock or watches
// the API. README.md explains the rules and the tracker's concurrency.
package model
