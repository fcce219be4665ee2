package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

// flipProbeResult is what the connections of one flip saw.
type flipProbeResult struct {
	// Update is when the API update was sent; FirstNew when the first connection that
	// the new pod answered was started (its SYN met the new rules), FirstNewAnswered when
	// that answer arrived.
	Update, FirstNew, FirstNewAnswered time.Time
	// Probes is the number of connections started; Stale counts those started after
	// FirstNew that the old pod answered (a proxy that programs a change atomically has
	// none); Unanswered those nobody answered (refused, timed out).
	Probes, Stale, Unanswered int
}

// answer is one connection of a flip: when it was started and which pod answered ("" for
// none).
type answer struct {
	start, answered time.Time
	pod             string
}

// probeFlip opens a TCP connection from netns to target every interval, calls update (the
// API write) once the first connection is on its way, and returns when a connection was
// answered by the pod named want (or timeout passes). Connections are opened from one
// thread inside the namespace, non-blocking, and read by a goroutine each, so that the
// interval holds whatever the answers take; each is closed with a reset, leaving no
// TIME_WAIT behind to exhaust the node's ports over thousands of flips.
func probeFlip(ctx context.Context, netns string, target netip.AddrPort, want, old string, interval, timeout time.Duration,
	update func() (time.Time, error)) (flipProbeResult, error) {
	var (
		res       flipProbeResult
		mu        sync.Mutex
		answers   []answer
		readers   sync.WaitGroup
		found     = make(chan struct{})
		foundOnce sync.Once
		probing   = make(chan struct{})
		updated   = make(chan error, 1)
	)
	go func() {
		<-probing
		at, err := update()
		res.Update = at
		updated <- err
	}()
	sa := &unix.SockaddrInet4{Port: int(target.Port()), Addr: target.Addr().As4()}
	err := netnstest.Do(netns, func() error {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		deadline := time.Now().Add(timeout)
		for {
			start := time.Now()
			conn, err := connectNonBlocking(sa)
			res.Probes++
			if err != nil {
				mu.Lock()
				answers = append(answers, answer{start: start})
				mu.Unlock()
			} else {
				readers.Add(1)
				go func() {
					defer readers.Done()
					pod := readPod(conn, probeTimeout)
					a := answer{start: start, answered: time.Now(), pod: pod}
					mu.Lock()
					answers = append(answers, a)
					mu.Unlock()
					if pod == want {
						foundOnce.Do(func() { close(found) })
					}
				}()
			}
			if res.Probes == 1 {
				close(probing)
			}
			select {
			case <-found:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not answer %s within %s: %w", want, target, timeout, context.DeadlineExceeded)
			}
		}
	})
	if res.Probes == 0 {
		close(probing)
	}
	readers.Wait()
	if uerr := <-updated; uerr != nil {
		return res, uerr
	}
	if err != nil {
		return res, err
	}
	return res, summariseFlip(&res, answers, want, old)
}

// summariseFlip fills FirstNew, FirstNewAnswered, Stale and Unanswered from the answers.
func summariseFlip(res *flipProbeResult, answers []answer, want, old string) error {
	for _, a := range answers {
		if a.pod == want && (res.FirstNew.IsZero() || a.start.Before(res.FirstNew)) {
			res.FirstNew, res.FirstNewAnswered = a.start, a.answered
		}
	}
	if res.FirstNew.IsZero() {
		return fmt.Errorf("no connection was answered by %s", want)
	}
	if res.FirstNew.Before(res.Update) {
		return fmt.Errorf("%s answered a connection started %s before the update", want, res.Update.Sub(res.FirstNew))
	}
	for _, a := range answers {
		switch {
		case a.pod == "":
			res.Unanswered++
		case a.pod == old && a.start.After(res.FirstNew):
			res.Stale++
		}
	}
	return nil
}

// connectNonBlocking starts a TCP connection on the calling thread (so in its network
// namespace) and hands the socket to Go's poller. SO_LINGER 0 makes the close a reset.
func connectNonBlocking(sa *unix.SockaddrInet4) (net.Conn, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("SO_LINGER: %w", err)
	}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("connect: %w", err)
	}
	f := os.NewFile(uintptr(fd), "probe")
	defer f.Close()
	return net.FileConn(f)
}

// readPod reads the echo server's reply line and returns the pod that sent it, "" when
// nothing came (refused, dropped, malformed).
func readPod(conn net.Conn, timeout time.Duration) string {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return ""
	}
	r, err := echo.ParseReply(strings.TrimSpace(line))
	if err != nil {
		return ""
	}
	return r.Pod
}
