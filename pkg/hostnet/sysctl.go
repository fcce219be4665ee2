package hostnet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Sysctls reads and writes integer sysctls, named by their path below /proc/sys
// ("net/ipv4/ip_forward"). Code that sets sysctls takes one, so that tests can give it an
// in-memory fake; ProcSys is the kernel's.
type Sysctls interface {
	// Get returns the sysctl's value.
	Get(name string) (int, error)
	// Set writes value to the sysctl.
	Set(name string, value int) error
}

// procSysRoot is where the kernel shows its sysctls.
const procSysRoot = "/proc/sys"

// ProcSys is the kernel's Sysctls, read and written as files under /proc/sys (or, from
// SysModule, under /sys/module). The zero value is ready to use and reads /proc/sys. /proc/sys/net shows the network namespace of the process that mounted
// /proc, which for sluice (and its kernel tests, which re-exec in a fresh namespace) is the
// namespace it programs.
type ProcSys struct {
	// root replaces /proc/sys in tests.
	root string
}

var _ Sysctls = ProcSys{}

func (p ProcSys) path(name string) string {
	root := p.root
	if root == "" {
		root = procSysRoot
	}
	return filepath.Join(root, name)
}

// Get reads the sysctl name and parses its value.
func (p ProcSys) Get(name string) (int, error) {
	b, err := os.ReadFile(p.path(name))
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: %w", name, err)
	}
	return v, nil
}

// Set writes value to the sysctl name, as sysctl(8) -w does.
func (p ProcSys) Set(name string, value int) error {
	return os.WriteFile(p.path(name), []byte(strconv.Itoa(value)+"\n"), 0o640)
}

// EnsureSysctl sets the sysctl name to value unless it has that value already: a write the
// kernel does not need is left out, so that a read-only /proc/sys where everything is
// already set (a node prepared by its operator) is no error.
func EnsureSysctl(s Sysctls, name string, value int) error {
	if v, err := s.Get(name); err == nil && v == value {
		return nil
	}
	if err := s.Set(name, value); err != nil {
		return fmt.Errorf("set sysctl %s=%d: %w", name, value, err)
	}
	return nil
}

// moduleRoot is where the kernel shows the parameters of loaded modules.
const moduleRoot = "/sys/module"

// SysModule returns Sysctls for the kernel's module parameters, named below /sys/module
// ("nf_conntrack/parameters/hashsize"). In a container /sys is mounted read-only unless the
// container is privileged, like /proc/sys.
func SysModule() ProcSys { return ProcSys{root: moduleRoot} }

// IsNotWritable reports whether err says that this process may not write the file: a
// read-only mount (EROFS, what an unprivileged container's /proc/sys and /sys are), or a
// permission the process lacks (EACCES, EPERM). Such a failure is the environment's, not a
// wrong value's.
func IsNotWritable(err error) bool {
	return errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS)
}

// Tolerant is Sysctls whose Set reports a write the process may not make (IsNotWritable)
// to Warn and succeeds, so that the setup goes on. Every other failure is returned. sluice's
// long-running container uses it: it has no write access to /proc/sys, and a value that
// differs from what it wants (an agent reset it, CPU hot-add changed it) must not keep it
// from starting; the privileged --init-only container uses the plain Sysctls, where a
// failure is an error.
type Tolerant struct {
	Sysctls
	// Warn is called with the sysctl, the value that could not be written and why.
	Warn func(name string, value int, err error)
}

// Set writes value, or reports the failure to Warn when the process may not write it.
func (t Tolerant) Set(name string, value int) error {
	err := t.Sysctls.Set(name, value)
	if err != nil && IsNotWritable(err) {
		t.Warn(name, value, err)
		return nil
	}
	return err
}
