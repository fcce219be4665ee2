package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// statusBytes reads a "kB" field of /proc/<pid>/status (VmHWM, VmRSS) in bytes.
func statusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusField(b, field)
}

func parseStatusField(status []byte, field string) (int64, error) {
	for _, line := range bytes.Split(status, []byte("\n")) {
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok || string(name) != field {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) == 0 {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", field, err)
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("no %s in status", field)
}

// cpuTime is a process's CPU time: its own (utime + stime of /proc/<pid>/stat) and that
// of the children it has waited for (cutime + cstime): the proxy's own work, and its nft
// or iptables-restore runs.
type cpuTime struct {
	Self, Children float64
}

// Total is the process's and its children's CPU time.
func (c cpuTime) Total() float64 { return c.Self + c.Children }

func cpuOf(pid int) (cpuTime, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTime{}, err
	}
	return parseStatCPU(b)
}

func parseStatCPU(stat []byte) (cpuTime, error) {
	// The command name (field 2) is in parentheses and may hold spaces: count fields after
	// the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return cpuTime{}, fmt.Errorf("malformed stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime..cstime are fields 14..17.
	if len(f) < 15 {
		return cpuTime{}, fmt.Errorf("malformed stat: %d fields", len(f))
	}
	var ticks [4]int64
	for k, s := range f[11:15] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return cpuTime{}, fmt.Errorf("malformed stat: %w", err)
		}
		ticks[k] = n
	}
	return cpuTime{Self: float64(ticks[0]+ticks[1]) / clockTicks, Children: float64(ticks[2]+ticks[3]) / clockTicks}, nil
}

// descendants lists the pids of every child of pid, recursively, from
// /proc/<pid>/task/*/children.
func descendants(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", p))
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
					queue = append(queue, c)
				}
			}
		}
	}
	return out
}

// helperSampler follows the programs a proxy runs (nft, iptables-restore, ...) and keeps
// the largest peak RSS any of them reached: they are part of what a mode costs the node,
// but their memory never shows in the proxy's own VmHWM. A helper that lives less than
// the sampling interval may be missed.
type helperSampler struct {
	pid  int
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex
	peak int64
	name string
}

func startHelperSampler(pid int, every time.Duration) *helperSampler {
	s := &helperSampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *helperSampler) sample() {
	// Read each time: the process starts as `ip netns exec` and becomes the proxy by exec.
	self := commOf(s.pid)
	for _, c := range descendants(s.pid) {
		// A child caught between fork and exec is still the proxy (Go forks with
		// CLONE_VM: it even reports the proxy's VmHWM); it is not a helper yet.
		comm := commOf(c)
		if comm == "" || comm == self {
			continue
		}
		hwm, err := statusBytes(c, "VmHWM")
		if err != nil {
			continue
		}
		s.mu.Lock()
		if hwm > s.peak {
			s.peak, s.name = hwm, comm
		}
		s.mu.Unlock()
	}
}

// commOf is the command name of pid, "" if it is gone.
func commOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Peak returns the largest helper VmHWM seen so far, and the helper's name.
func (s *helperSampler) Peak() (int64, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak, s.name
}

// Stop ends the sampling.
func (s *helperSampler) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// loadAvg reads the 1, 5 and 15 minute load averages.
func loadAvg() [3]float64 {
	var out [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return out
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		out[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return out
}
