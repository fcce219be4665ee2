package conntrack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/cpuset"
)

// Settings are the conntrack section of the proxy configuration. A zero value leaves the
// kernel's setting alone. The fields are those of config.ConntrackSettings, in the same
// order, so one converts to the other.
type Settings struct {
	// MaxPerCore times the number of CPUs, but at least Min, is nf_conntrack_max;
	// MaxPerCore 0 leaves nf_conntrack_max (and Min) alone.
	MaxPerCore int
	Min        int
	// TCPEstablishedTimeout and TCPCloseWaitTimeout set nf_conntrack_tcp_timeout_*.
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal=1.
	TCPBeLiberal bool
	// UDPTimeout and UDPStreamTimeout set nf_conntrack_udp_timeout{,_stream}.
	UDPTimeout       time.Duration
	UDPStreamTimeout time.Duration
}

// maxLimit caps nf_conntrack_max computed from MaxPerCore: on a machine with many cores
// the product would reserve memory for far more connections than a node handles.
const maxLimit = 1 << 20

const (
	procNetfilter = "/proc/sys/net/netfilter/"
	hashsizePath  = "/sys/module/nf_conntrack/parameters/hashsize"
)

// fileSystem reads and writes the sysctl and module parameter files. A seam for tests.
type fileSystem interface {
	ReadFile(name string) ([]byte, error)
	WriteFile(name string, data []byte) error
}

type osFileSystem struct{}

func (osFileSystem) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }
func (osFileSystem) WriteFile(name string, data []byte) error {
	return os.WriteFile(name, data, 0o640)
}

// ApplySysctls sets the conntrack sysctls as upstream kube-proxy does in every mode:
// nf_conntrack_max is raised (never lowered) to max(MaxPerCore×CPUs, Min), the product
// capped at 1 048 576; the hash table is raised to a quarter of it; the TCP timeouts, the
// TCP "be liberal" switch and the UDP timeouts are set when configured.
//
// nf_conntrack_max and hashsize are global: only the host's initial network namespace may
// change them. An error names the first setting that could not be written; the settings
// before it were applied.
func ApplySysctls(ctx context.Context, s Settings) error {
	return applySysctls(ctx, s, osFileSystem{}, numCPU())
}

// numCPU counts the node's online CPUs. nf_conntrack_max is host-wide, so the process's
// cpuset (which runtime.NumCPU honours) is the wrong measure under a static CPU policy.
func numCPU() int {
	if n, err := cpuset.NumCPU(); err == nil && n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// conntrackMax returns the nf_conntrack_max the settings ask for, 0 for "leave it".
func conntrackMax(s Settings, cpus int) int {
	if s.MaxPerCore <= 0 {
		return 0
	}
	scaled := s.MaxPerCore * cpus
	if scaled > maxLimit {
		return maxLimit
	}
	if scaled > s.Min {
		return scaled
	}
	return s.Min
}

func applySysctls(ctx context.Context, s Settings, fs fileSystem, cpus int) error {
	logger := klog.FromContext(ctx)
	readInt := func(name string) (int, error) {
		b, err := fs.ReadFile(name)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(b)))
	}
	set := func(name string, value int) error {
		if cur, err := readInt(name); err == nil && cur == value {
			return nil
		}
		logger.Info("Setting conntrack parameter", "entry", strings.TrimPrefix(name, "/proc/sys/"), "value", value)
		if err := fs.WriteFile(name, []byte(strconv.Itoa(value))); err != nil {
			return fmt.Errorf("setting %s to %d: %w", name, value, err)
		}
		return nil
	}

	if max := conntrackMax(s, cpus); max > 0 {
		if cur, err := readInt(procNetfilter + "nf_conntrack_max"); err != nil || cur < max {
			if err := set(procNetfilter+"nf_conntrack_max", max); err != nil {
				return err
			}
		}
		hashsize, err := readInt(hashsizePath)
		if err != nil {
			return fmt.Errorf("reading conntrack hashsize: %w", err)
		}
		if hashsize < max/4 {
			if err := set(hashsizePath, max/4); err != nil {
				if errors.Is(err, os.ErrPermission) || isReadOnly(err) {
					return fmt.Errorf("%w (is /sys mounted read-only? the hash table then stays at %d buckets)", err, hashsize)
				}
				return err
			}
		}
	}
	seconds := func(d time.Duration) int { return int(d / time.Second) }
	if s.TCPEstablishedTimeout > 0 {
		if err := set(procNetfilter+"nf_conntrack_tcp_timeout_established", seconds(s.TCPEstablishedTimeout)); err != nil {
			return err
		}
	}
	if s.TCPCloseWaitTimeout > 0 {
		if err := set(procNetfilter+"nf_conntrack_tcp_timeout_close_wait", seconds(s.TCPCloseWaitTimeout)); err != nil {
			return err
		}
	}
	if s.TCPBeLiberal {
		if err := set(procNetfilter+"nf_conntrack_tcp_be_liberal", 1); err != nil {
			return err
		}
	}
	if s.UDPTimeout > 0 {
		if err := set(procNetfilter+"nf_conntrack_udp_timeout", seconds(s.UDPTimeout)); err != nil {
			return err
		}
	}
	if s.UDPStreamTimeout > 0 {
		if err := set(procNetfilter+"nf_conntrack_udp_timeout_stream", seconds(s.UDPStreamTimeout)); err != nil {
			return err
		}
	}
	return nil
}

func isReadOnly(err error) bool {
	var pe *os.PathError
	return errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "read-only")
}
