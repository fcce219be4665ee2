package topology

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
)

// Process is a command running inside a host's namespace, its output going to a log file.
type Process struct {
	// Name identifies the process in logs (e.g. "sluice-node-a", "echo-a0").
	Name string
	Host *Host
	// LogPath is the file receiving the process' stdout and stderr.
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid once done is closed
	once sync.Once
}

// Start runs name with args inside h's namespace (`ip netns exec`). The process is stopped
// when the test ends (before the topology is torn down) or by Stop.
func (h *Host) Start(procName, name string, args ...string) (*Process, error) {
	c := h.c
	logPath := filepath.Join(c.LogDir, procName+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log file for %s: %w", procName, err)
	}
	fmt.Fprintf(logFile, "=== %s: ip netns exec %s %s %s\n", time.Now().Format(time.RFC3339Nano), h.NetNS, name, strings.Join(args, " "))
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.NetNS, name}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// If the test binary dies, so do its children: nothing keeps a namespace alive.
	// Pdeathsig follows the thread that forks, so fork from a thread that stays.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s in %s: %w", procName, h.Name, err)
	}
	p := &Process{Name: procName, Host: h, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	c.mu.Lock()
	c.processes = append(c.processes, p)
	c.mu.Unlock()
	return p, nil
}

// Pid is the process id (`ip netns exec` execs the command, so it is the command's own).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM, waits up to 10s, then SIGKILL. It is safe to call more than once.
func (p *Process) Stop() {
	p.once.Do(func() {
		if exited, _ := p.Exited(); exited {
			return
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// Tail returns the last n lines of the process' log.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stopAll stops every process this cluster started, newest first.
func (c *Cluster) stopAll() {
	c.mu.Lock()
	procs := c.processes
	c.processes = nil
	c.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}
}

// EchoServerBinary returns the path of a static echoserver binary: $SLUICE_ECHOSERVER when
// set, else one built once per test process with `go build` (cached by the Go toolchain)
// into a fixed place under the temporary directory, so that runs do not pile up copies.
func EchoServerBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SLUICE_ECHOSERVER"); p != "" {
		return p
	}
	echoBuild.Do(func() {
		dir := filepath.Join(os.TempDir(), "sluice-conformance-bin")
		if echoBuild.err = os.MkdirAll(dir, 0o755); echoBuild.err != nil {
			return
		}
		echoBuild.path = filepath.Join(dir, "echoserver")
		// Built under a private name and renamed into place: a concurrent run keeps
		// executing the file it started with.
		tmp := fmt.Sprintf("%s.%d", echoBuild.path, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, "github.com/sluiceproxy/sluice/test/echoserver")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.Remove(tmp)
			echoBuild.err = fmt.Errorf("go build echoserver: %w: %s", err, out)
			return
		}
		echoBuild.err = os.Rename(tmp, echoBuild.path)
	})
	if echoBuild.err != nil {
		t.Fatal(echoBuild.err)
	}
	return echoBuild.path
}

var echoBuild struct {
	sync.Once
	path string
	err  error
}

// EchoOptions say what every echo server listens on.
type EchoOptions struct {
	// Binary is the echoserver to run; default EchoServerBinary(t).
	Binary string
	// Ports default to 8080.
	Ports []uint16
	// Protocols default to TCP, UDP and SCTP (SCTP is skipped by the server where the
	// kernel lacks it).
	Protocols []echo.Protocol
	// ReadyTimeout bounds the wait for each server's first answer; default 10 s. Under
	// emulation (the IPVS VM), while kube-apiserver starts, a server that already accepts
	// connections can take longer than that to answer: callers there pass their readiness
	// limit, and each probe then waits 2 s instead of 500 ms.
	ReadyTimeout time.Duration
}

// StartEcho starts an echo server in each given pod (all pods when none are given) and
// waits until each answers its node over TCP (or UDP) on the first port.
func (c *Cluster) StartEcho(t testing.TB, opts EchoOptions, pods ...*Pod) {
	t.Helper()
	if opts.Binary == "" {
		opts.Binary = EchoServerBinary(t)
	}
	if len(opts.Ports) == 0 {
		opts.Ports = []uint16{8080}
	}
	if len(opts.Protocols) == 0 {
		opts.Protocols = []echo.Protocol{echo.TCP, echo.UDP, echo.SCTP}
	}
	if len(pods) == 0 {
		pods = c.Pods()
	}
	var ports, protos []string
	for _, p := range opts.Ports {
		ports = append(ports, strconv.Itoa(int(p)))
	}
	for _, p := range opts.Protocols {
		protos = append(protos, string(p))
	}
	wait, probeTimeout := 10*time.Second, 500*time.Millisecond
	if opts.ReadyTimeout > wait {
		wait, probeTimeout = opts.ReadyTimeout, 2*time.Second
	}
	probeProto := echo.TCP
	if !containsProto(opts.Protocols, echo.TCP) {
		probeProto = echo.UDP
	}
	for _, pod := range pods {
		proc, err := pod.Start("echo-"+pod.Name, opts.Binary, "serve", "-pod", pod.Name,
			"-ports", strings.Join(ports, ","), "-protocols", strings.Join(protos, ","))
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range pod.IPs() {
			target := netip.AddrPortFrom(ip, opts.Ports[0])
			err := waitFor(wait, func() error {
				if exited, err := proc.Exited(); exited {
					return fmt.Errorf("echo server in %s exited: %w\n%s", pod.Name, err, proc.Tail(20))
				}
				out := pod.Node.Probe(probeProto, target, echo.ProbeOptions{Timeout: probeTimeout})
				if out.Result != echo.Answered || out.Reply.Pod != pod.Name {
					return fmt.Errorf("echo server in %s not answering %s from its node: %s", pod.Name, target, out)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

func containsProto(list []echo.Protocol, p echo.Protocol) bool {
	for _, x := range list {
		if x == p {
			return true
		}
	}
	return false
}

// killNetnsPids kills every process left inside a namespace of a run that is gone. They
// were all started by that run (nothing else enters a slct- namespace), and a process left
// inside would keep the namespace, its veths and its routes alive after `ip netns del`.
func killNetnsPids(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	for _, f := range bytes.Fields(out) {
		if pid, err := strconv.Atoi(string(f)); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
