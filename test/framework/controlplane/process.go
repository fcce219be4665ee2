package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one run of etcd or kube-apiserver, in a process group of its own so that
// stopping it also stops anything it spawned.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	// logOffset is where this run's output starts in logPath: a restarted kube-apiserver
	// appends to the same file, and errors quote only the current run.
	logOffset int64
	exited    chan struct{} // closed once Wait returned
	waitErr   error         // Wait's result; read only after exited is closed
}

// startProcess runs binary with args, its stdout and stderr appended to logPath.
func startProcess(name, binary string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s log: %w", name, err)
	}
	defer func() { _ = logFile.Close() }() // the child holds its own descriptor
	fmt.Fprintf(logFile, "==== %s: starting %s %s\n", time.Now().Format(time.RFC3339Nano), binary, strings.Join(args, " "))
	offset, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("seeking %s log: %w", name, err)
	}

	cmd := exec.Command(binary, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// If the test binary dies without cleaning up (a panic, go test's timeout), the
		// kernel kills the child instead of leaving it running and holding ports.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logOffset: offset, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop sends SIGTERM to the process group, waits up to grace for the process to exit,
// then kills the group. It returns nil when the process was stopped by us, and the exit
// error when it had already died on its own.
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.exited:
		p.killGroup() // stragglers, if any
		return p.exitError()
	default:
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.killGroup()
		<-p.exited
	}
	p.killGroup()
	return nil
}

func (p *process) killGroup() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// exitError describes an exit that nobody asked for.
func (p *process) exitError() error {
	if p.waitErr != nil {
		return fmt.Errorf("%s exited: %w", p.name, p.waitErr)
	}
	return fmt.Errorf("%s exited with status 0", p.name)
}

// hasExited reports whether the process is gone.
func (p *process) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// logTail returns the last lines (at most maxLines) this run wrote to its log.
func (p *process) logTail(maxLines int) string {
	return fileTail(p.logPath, p.logOffset, maxLines)
}

// logContains reports whether this run's log contains s.
func (p *process) logContains(s string) bool {
	data, err := readFrom(p.logPath, p.logOffset, 1<<20)
	return err == nil && bytes.Contains(data, []byte(s))
}

// tailWindow bounds how much of a log is read to find its last lines.
const tailWindow = 64 << 10

// fileTail returns the last maxLines lines of path after offset.
func fileTail(path string, offset int64, maxLines int) string {
	data, err := readFrom(path, offset, tailWindow)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return lastLines(data, maxLines)
}

// readFrom reads path from offset, keeping at most the last limit bytes.
func readFrom(path string, offset, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	start := max(offset, info.Size()-limit)
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// lastLines returns the last n lines of data, without a trailing newline.
func lastLines(data []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errAddressInUse marks a start that failed because a port picked as free was taken
// before the process bound it; the caller retries with other ports.
var errAddressInUse = errors.New("address already in use")
