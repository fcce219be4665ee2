// Package rollout tests what decides whether sluice can be rolled out to every node of a
// fleet: that it starts wherever upstream kube-proxy starts, is alive before it is ready,
// turns surprises of the node's environment into warnings (a log line, a metric and a
// Warning Event on the Node) instead of crash loops, and restarts exactly when it must.
// Everything is real: a real kube-apiserver and etcd (test/framework/controlplane), sluice
// as a process in a network-namespace node (test/topology), and real packets to a Service.
//
// The tests are part of the e2e tier (build tag e2e) and need root; run them with
//
//	make test-e2e                              # hack/test-e2e.sh: builds bin/sluice, finds the control plane
//	hack/test-e2e.sh -run TestReadOnlyProcSys  # only matching tests (of every e2e package)
//	SLUICE_BIN=$PWD/bin/sluice go test -tags e2e ./test/rollout -run TestReadOnlyProcSys -v
//
// TestMain re-executes the test binary in a private network namespace (netnstest), so the
// machine's own namespace is never touched.
//
// # Writing a test here
//
// Each test builds its own world with NewEnv and runs sluice in it as often as it likes;
// env_test.go holds that scaffolding:
//
//	env := NewEnv(t)                          // control plane + node-a, pods a0 (echo) and a1, dual-stack
//	name := env.RegisterNode(t, "nodeA-nft", NodeOptions{PodCIDRs: true})
//	s := env.StartSluice(t, SluiceOptions{Node: name, Config: env.Config(name, "nftables", extraYAML)})
//	s.WaitLivez(t, 10*time.Second)           // /livez answers 200 (returns how long it took)
//	s.WaitSynced(t)                           // the first sync of every family is done
//	svc := env.EchoService(t, name)           // a fresh dual-stack ClusterIP Service backed by a0
//	env.ExpectServed(t, s, svc)               // real packets from a1 and from the node reach a0, per family
//	s.WaitMetric(t, "sluice_config_warnings", 2, "kind", "unknown_field")
//	env.WaitNodeEvent(t, name, "ConfigurationWarning")
//	s.Stop()                                  // also done when the test ends
//
// Several sluice runs share the one node namespace, one after the other (never two at
// once: they would fight over the rules). Give each run its own Node object (RegisterNode
// with a new name; the Node name is what --hostname-override says, the namespace is the
// same) so that Events and metrics cannot be confused between runs, and its own Service
// (EchoService), created after that sluice started, so that a reply proves this sluice
// programmed it and not rules an earlier run left in the kernel.
//
// SluiceOptions.Wrap runs sluice under another command, for example in a private mount
// namespace with /proc/sys read-only (ReadOnlyProcSys) or without a capability
// (WithoutCapability).
//
// Configurations leave conntrack.maxPerCore at 0: nf_conntrack_max and the conntrack hash
// size are global to the machine, not per namespace. Per-namespace conntrack sysctls
// (timeouts) may be set.
package rollout
