// Package explain answers "where does this packet go on this node, and why?" from the
// desired state the daemon publishes (model.StateView) and the few settings that decide a
// packet's fate besides it (nodePortAddresses, the local-traffic detector, the mode).
//
// It is pure: no I/O, no clock. `sluice explain` feeds it the live state read from the
// daemon's /debug/sluice/state, or a state computed offline with model.Compute from
// objects as `kubectl get -o yaml` prints them (DecodeObjects).
//
// The model publishes only the final endpoint lists. To say why each other endpoint was
// left out, Select re-evaluates the model's documented selection rules on AllEndpoints,
// endpoint by endpoint; a property test checks on random states that the candidates it
// finds are exactly the model's ClusterEndpoints and LocalEndpoints, so the explanation and
// the programmed rules cannot disagree. README.md lists the rules and every reason.
package explain
