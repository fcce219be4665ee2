package leftovers

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := isNotSupported(tc.err); got != tc.want {
				t.Errorf("isNotSupported(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
