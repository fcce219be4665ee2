package hostnet

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestParseKernelReleaseReadsWhatUnameSays(t *testing.T) {
	tests := []struct {
		release string
		want    KernelVersion
		ok513   bool
	}{
		{"6.1.0-56-amd64", KernelVersion{6, 1, 0}, true},
		{"5.10.0", KernelVersion{5, 10, 0}, false},
		{"4.19.112+", KernelVersion{4, 19, 112}, false},
		{"6.18.44-fc-v657", KernelVersion{6, 18, 44}, true},
		{"5.14.0-427.el9.x86_64", KernelVersion{5, 14, 0}, true},
		{"5.13.0", KernelVersion{5, 13, 0}, true},
		{"5.4.0-150-generic", KernelVersion{5, 4, 0}, false},
		{"4.18.0-553.el8_10.x86_64", KernelVersion{4, 18, 0}, false},
		{"6.9", KernelVersion{6, 9, 0}, true},
		{"6.2-rc1", KernelVersion{6, 2, 0}, true},
	}
	for _, tc := range tests {
		t.Run(tc.release, func(t *testing.T) {
			got, err := ParseKernelRelease(tc.release)
			if err != nil || got != tc.want {
				t.Fatalf("ParseKernelRelease(%q) = %v, %v; want %v", tc.release, got, err, tc.want)
			}
			if got.AtLeast(5, 13) != tc.ok513 {
				t.Errorf("%v.AtLeast(5, 13) = %v", got, !tc.ok513)
			}
		})
	}
	for _, bad := range []string{"linux", "garbage", "6", "x.1", "6.y"} {
		if v, err := ParseKernelRelease(bad); err == nil {
			t.Errorf("ParseKernelRelease(%q) = %v, want an error", bad, v)
		}
	}
}

func TestRunningKernelIsParsable(t *testing.T) {
	v, err := RunningKernel()
	if err != nil || v.Major == 0 {
		t.Fatalf("RunningKernel() = %v, %v", v, err)
	}
}

func TestIsNotSupportedMeansTheKernelLacksTheSubsystem(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "protocol not supported", err: syscall.EPROTONOSUPPORT, want: true},
		{name: "address family not supported, wrapped", err: fmt.Errorf("list tables: %w", syscall.EAFNOSUPPORT), want: true},
		{name: "operation not supported", err: syscall.EOPNOTSUPP, want: true},
		{name: "said in words only", err: errors.New("netlink receive: protocol not supported"), want: true},
		{name: "permission denied", err: syscall.EPERM, want: false},
		{name: "anything else", err: errors.New("no such file or directory"), want: false},
		{name: "no error", err: nil, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsNotSupported(tc.err); got != tc.want {
				t.Errorf("IsNotSupported(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
