package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluiceproxy/sluice/test/topology"
)

// StateFile is the name of the state file in the run directory.
const StateFile = "state.json"

// State is what a running sandbox has created, written to its run directory as soon as
// anything exists, so that Down can remove it from another process.
type State struct {
	// PID is the sandbox process; every network namespace it creates is named
	// NetnsPrefix*, every link in the root namespace LinkPrefix* (test/topology's scheme).
	PID         int    `json:"pid"`
	Mode        string `json:"mode"`
	RunDir      string `json:"runDir"`
	NetnsPrefix string `json:"netnsPrefix"`
	LinkPrefix  string `json:"linkPrefix"`
	Started     string `json:"started"`
	// Ready is set once the sandbox is up; the fields below are known from then on.
	Ready      bool   `json:"ready"`
	APIBridge  string `json:"apiBridge,omitempty"`
	APIAddress string `json:"apiAddress,omitempty"`
	Kubeconfig string `json:"kubeconfig,omitempty"`
}

// newState is the state of the current process before it builds anything.
func newState(mode, runDir string) *State {
	pid := os.Getpid()
	return &State{
		PID: pid, Mode: mode, RunDir: runDir,
		// test/topology names: namespaces slct-<pid>-<seq>-<host>, links slct<pid hex><seq>...
		NetnsPrefix: fmt.Sprintf("slct-%d-", pid),
		LinkPrefix:  fmt.Sprintf("slct%06x", pid),
		Started:     time.Now().Format(time.RFC3339),
	}
}

func (s *State) write() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(s.RunDir, StateFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(s.RunDir, StateFile))
}

// ReadState reads a run directory's state file; fs.ErrNotExist when there is none.
func ReadState(runDir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(runDir, StateFile))
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(runDir, StateFile), err)
	}
	return &s, nil
}

// Alive reports whether the sandbox process of s still runs (and is a sandbox, not a
// process that reused its id).
func (s *State) Alive() bool {
	if s.PID <= 0 || syscall.Kill(s.PID, 0) != nil {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.PID))
	return err == nil && bytes.Contains(cmdline, []byte("sandbox"))
}

// Down tears down the sandbox of runDir: it asks a running sandbox to stop (SIGTERM, then
// waits for it to tear itself down) or, when the process is gone, removes what it left:
// network namespaces (and the processes in them), links in this namespace, processes
// started from the run directory, and the run directory itself. It then checks that
// nothing is left. logf reports progress.
func Down(runDir string, logf func(string, ...any)) error {
	st, err := ReadState(runDir)
	if errors.Is(err, fs.ErrNotExist) {
		if _, statErr := os.Stat(runDir); statErr == nil {
			logf("no state file in %s; removing the directory", runDir)
			killProcessesUsing(runDir, logf)
			return os.RemoveAll(runDir)
		}
		logf("no sandbox in %s: nothing to tear down", runDir)
		return nil
	}
	if err != nil {
		return err
	}
	if st.Alive() {
		logf("asking the sandbox (pid %d) to tear itself down", st.PID)
		_ = syscall.Kill(st.PID, syscall.SIGTERM)
		deadline := time.Now().Add(2 * time.Minute)
		for st.Alive() && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if st.Alive() {
			logf("the sandbox did not stop in 2 minutes; killing it")
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
			time.Sleep(500 * time.Millisecond)
		}
	} else {
		logf("the sandbox process %d is gone; removing what it left", st.PID)
	}

	var errs []error
	killProcessesUsing(runDir, logf)
	// The process is gone, so test/topology counts its namespaces and links as leftovers
	// (it also removes those of other crashed runs, which is what they are there for).
	if err := topology.Teardown(); err != nil {
		errs = append(errs, err)
	}
	for _, ns := range listNetns(st.NetnsPrefix) {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", ns, err, out))
		}
	}
	for _, l := range listLinks(st.LinkPrefix) {
		if out, err := exec.Command("ip", "link", "del", l).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", l, err, out))
		}
	}
	if err := os.RemoveAll(runDir); err != nil {
		errs = append(errs, err)
	}
	if left := Leftovers(st); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still present: %s", strings.Join(left, ", ")))
	}
	return errors.Join(errs...)
}

// Leftovers lists what of the sandbox st still exists: its network namespaces, its links
// in this namespace, processes started from its run directory, the run directory.
func Leftovers(st *State) []string {
	var out []string
	for _, ns := range listNetns(st.NetnsPrefix) {
		out = append(out, "netns "+ns)
	}
	for _, l := range listLinks(st.LinkPrefix) {
		out = append(out, "link "+l)
	}
	for _, pid := range processesUsing(st.RunDir) {
		out = append(out, fmt.Sprintf("process %d", pid))
	}
	if st.PID != os.Getpid() && st.Alive() {
		out = append(out, fmt.Sprintf("sandbox process %d", st.PID))
	}
	if _, err := os.Stat(st.RunDir); err == nil {
		out = append(out, "directory "+st.RunDir)
	}
	return out
}

func listNetns(prefix string) []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names
}

func listLinks(prefix string) []string {
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		return nil
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	return names
}

// processesUsing returns the processes whose command line or working directory is inside
// dir: every process the sandbox starts (sluice, echo servers, etcd, kube-apiserver) names
// a file or directory under its run directory, which is unique to the run.
func processesUsing(dir string) []int {
	if dir == "" || dir == "/" {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(cmdline, []byte(dir+"/")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killProcessesUsing(dir string, logf func(string, ...any)) {
	for _, pid := range processesUsing(dir) {
		logf("killing process %d (started by the sandbox)", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
