package nftables

import (
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
)

func TestCheckKernelWantsUpstreamsMinimumUnlessOverridden(t *testing.T) {
	if err := checkKernel(hostnet.KernelVersion{Major: 5, Minor: 13}); err != nil {
		t.Errorf("5.13: %v", err)
	}
	t.Setenv(skipKernelCheckEnv, "")
	if err := checkKernel(hostnet.KernelVersion{Major: 5, Minor: 10}); err == nil || !strings.Contains(err.Error(), skipKernelCheckEnv) {
		t.Errorf("5.10: %v", err)
	}
	t.Setenv(skipKernelCheckEnv, "1")
	if err := checkKernel(hostnet.KernelVersion{Major: 5, Minor: 10}); err != nil {
		t.Errorf("5.10 with the override: %v", err)
	}
}
