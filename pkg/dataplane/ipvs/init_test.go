package ipvs

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestApplyKernelSettingsDoesWhatNewSetsAndNothingElse(t *testing.T) {
	k := newFakeNode()
	for _, name := range []string{sysctlVSConnTrack, sysctlExpireNoDestConn, sysctlExpireQuiescentTemplate, sysctlIPForward, sysctlConnReuseMode} {
		k.sysctls[name] = 0
	}
	err := ApplyKernelSettings(context.Background(), Settings{StrictARP: true, TCPFinTimeout: 30 * time.Second}, withFake(k))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		sysctlVSConnTrack: 1, sysctlExpireNoDestConn: 1, sysctlExpireQuiescentTemplate: 1, sysctlIPForward: 1,
		sysctlConnReuseMode: 1, // the fake is Linux 6.1
		sysctlARPIgnore:     1, sysctlARPAnnounce: 2,
	}
	for name, v := range want {
		if got := k.sysctls[name]; got != v {
			t.Errorf("%s = %d, want %d", name, got, v)
		}
	}
	if k.timeouts != [3]time.Duration{0, 30 * time.Second, 0} {
		t.Errorf("IPVS timeouts = %v, want only tcpfin 30s", k.timeouts)
	}
	if len(k.services) != 0 || len(k.sets) != 0 || len(k.links[dummyDevice]) != 0 {
		t.Errorf("programmed more than settings:\n%s", k.dumpIPVS())
	}
}

func TestApplyKernelSettingsFailsWithoutIPVS(t *testing.T) {
	k := newFakeNode()
	err := ApplyKernelSettings(context.Background(), Settings{}, withFake(k), func(o *options) {
		o.supported = func() (bool, error) { return false, nil }
	})
	if !errors.Is(err, ErrNoIPVS) {
		t.Fatalf("ApplyKernelSettings = %v, want ErrNoIPVS", err)
	}
	if k.sysctls[sysctlVSConnTrack] == 1 {
		t.Error("sysctls set on a kernel without IPVS")
	}
}
