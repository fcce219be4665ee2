package controlplane

import "testing"

// StartForTest starts a control plane for t and stops it in t.Cleanup. It fails t (with
// the tail of the failing process's log) if the control plane does not come up. When t
// has failed by cleanup time, the last lines of both logs are logged first, since the
// logs are removed with the control plane's directory unless Options.LogDir is set.
func StartForTest(t testing.TB, o Options) *ControlPlane {
	t.Helper()
	// t.Context() bounds only the start-up; the processes live until the cleanup below.
	cp, err := Start(t.Context(), o)
	if err != nil {
		t.Fatalf("starting control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", cp.APIServerLog(), fileTail(cp.APIServerLog(), 0, 40))
			t.Logf("last lines of %s:\n%s", cp.EtcdLog(), fileTail(cp.EtcdLog(), 0, 20))
		}
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping control plane: %v", err)
		}
	})
	return cp
}
