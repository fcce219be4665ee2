package hostnet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestProcSysReadsAndWritesBelowItsRoot(t *testing.T) {
	root := t.TempDir()
	const name = "net/ipv4/conf/all/route_localnet"
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
		t.Fatal(err)
	}
	p := ProcSys{root: root}
	if _, err := p.Get(name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Get of a missing sysctl: %v, want ErrNotExist", err)
	}
	if err := p.Set(name, 1); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "1\n" {
		t.Errorf("wrote %q, want %q", b, "1\n")
	}
	if v, err := p.Get(name); err != nil || v != 1 {
		t.Errorf("Get = %d, %v; want 1", v, err)
	}
	if err := os.WriteFile(filepath.Join(root, name), []byte("on\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(name); err == nil || !strings.Contains(err.Error(), name) {
		t.Errorf("Get of a non-integer: %v, want an error naming the sysctl", err)
	}
}

func TestProcSysZeroValueIsTheKernels(t *testing.T) {
	if got := (ProcSys{}).path("net/ipv4/ip_forward"); got != "/proc/sys/net/ipv4/ip_forward" {
		t.Errorf("path = %q", got)
	}
}

// fakeSysctls is an in-memory /proc/sys that counts writes; a name in fail refuses them.
type fakeSysctls struct {
	values map[string]int
	fail   map[string]bool
	writes int
}

func (f *fakeSysctls) Get(name string) (int, error) {
	v, ok := f.values[name]
	if !ok {
		return 0, os.ErrNotExist
	}
	return v, nil
}

func (f *fakeSysctls) Set(name string, value int) error {
	if f.fail[name] {
		return os.ErrPermission
	}
	f.writes++
	f.values[name] = value
	return nil
}

func TestEnsureSysctlWritesOnlyWhatDiffers(t *testing.T) {
	const name = "net/ipv4/vs/conntrack"
	tests := []struct {
		name       string
		values     map[string]int
		fail       bool
		wantWrites int
		wantErr    bool
	}{
		{name: "already set: no write", values: map[string]int{name: 1}, wantWrites: 0},
		{name: "another value: written", values: map[string]int{name: 0}, wantWrites: 1},
		{name: "unreadable: written", values: map[string]int{}, wantWrites: 1},
		{name: "already set on a read-only /proc/sys: no error", values: map[string]int{name: 1}, fail: true, wantWrites: 0},
		{name: "refused write: error", values: map[string]int{name: 0}, fail: true, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeSysctls{values: tc.values, fail: map[string]bool{name: tc.fail}}
			err := EnsureSysctl(f, name, 1)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && (!errors.Is(err, os.ErrPermission) || !strings.Contains(err.Error(), name+"=1")) {
				t.Errorf("err = %v, want the wrapped cause and the setting", err)
			}
			if f.writes != tc.wantWrites {
				t.Errorf("%d writes, want %d", f.writes, tc.wantWrites)
			}
			if !tc.wantErr && f.values[name] != 1 {
				t.Errorf("value %d, want 1", f.values[name])
			}
		})
	}
}

func TestIsNotWritable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&os.PathError{Op: "open", Path: "/proc/sys/x", Err: syscall.EROFS}, true},
		{&os.PathError{Op: "open", Path: "/proc/sys/x", Err: syscall.EACCES}, true},
		{&os.PathError{Op: "open", Path: "/proc/sys/x", Err: syscall.EPERM}, true},
		{fmt.Errorf("set sysctl x=1: %w", &os.PathError{Op: "open", Path: "/proc/sys/x", Err: syscall.EROFS}), true},
		{&os.PathError{Op: "write", Path: "/proc/sys/x", Err: syscall.EINVAL}, false},
		{&os.PathError{Op: "open", Path: "/proc/sys/x", Err: syscall.ENOENT}, false},
		{nil, false},
	} {
		if got := IsNotWritable(tc.err); got != tc.want {
			t.Errorf("IsNotWritable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestTolerantTurnsRefusedWritesIntoWarnings(t *testing.T) {
	const name = "net/ipv4/conf/all/route_localnet"
	var warned []string
	warn := func(n string, v int, err error) { warned = append(warned, fmt.Sprintf("%s=%d: %v", n, v, err)) }

	refused := Tolerant{Sysctls: &fakeSysctls{values: map[string]int{name: 0}, fail: map[string]bool{name: true}}, Warn: warn}
	if err := EnsureSysctl(refused, name, 1); err != nil {
		t.Errorf("a refused write is an error: %v", err)
	}
	if len(warned) != 1 || !strings.HasPrefix(warned[0], name+"=1") {
		t.Errorf("warnings %q", warned)
	}

	// A value already right is not written, so nothing is refused or warned about.
	warned = nil
	set := Tolerant{Sysctls: &fakeSysctls{values: map[string]int{name: 1}, fail: map[string]bool{name: true}}, Warn: warn}
	if err := EnsureSysctl(set, name, 1); err != nil || len(warned) != 0 {
		t.Errorf("err %v, warnings %q", err, warned)
	}

	// Other failures stay errors.
	invalid := Tolerant{Sysctls: rejectingSysctls{syscall.EINVAL}, Warn: warn}
	if err := invalid.Set(name, 7); !errors.Is(err, syscall.EINVAL) || len(warned) != 0 {
		t.Errorf("err %v, warnings %q", err, warned)
	}
}

func TestSysModuleReadsBelowSysModule(t *testing.T) {
	if got := SysModule().path("nf_conntrack/parameters/hashsize"); got != "/sys/module/nf_conntrack/parameters/hashsize" {
		t.Errorf("path = %q", got)
	}
}

// rejectingSysctls fails every Set with err.
type rejectingSysctls struct{ err error }

func (r rejectingSysctls) Get(string) (int, error) { return 0, os.ErrNotExist }
func (r rejectingSysctls) Set(string, int) error   { return r.err }
