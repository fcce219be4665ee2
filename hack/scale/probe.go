package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/topology"
)

// probeTimeout bounds each probe. Probes overlap (one starts every interval), so a probe
// whose SYN was dropped before the rules existed does not delay the detection: a later
// one gets through.
const probeTimeout = time.Second

// errGaveUp is returned by waitAnswer when stop says so.
var errGaveUp = errors.New("gave up")

// waitAnswer starts a TCP probe from client to target every interval until one is answered
// by the pod named want, and returns when that answer arrived and how many probes were
// sent. It returns an error when ctx ends, when timeout passes, or when stop (checked
// every interval) returns an error.
func waitAnswer(ctx context.Context, client *topology.Pod, target netip.AddrPort, want string,
	interval, timeout time.Duration, stop func() error) (time.Time, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type answer struct {
		at  time.Time
		out echo.Outcome
	}
	answers := make(chan answer, 64)
	var wg sync.WaitGroup
	defer wg.Wait()
	probes := 0
	var unexpected echo.Outcome
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		wg.Add(1)
		probes++
		go func() {
			defer wg.Done()
			out := client.Probe(echo.TCP, target, echo.ProbeOptions{Timeout: probeTimeout})
			select {
			case answers <- answer{time.Now(), out}:
			case <-ctx.Done():
			}
		}()
	wait:
		for {
			select {
			case a := <-answers:
				if a.out.Result == echo.Answered && a.out.Reply.Pod == want {
					return a.at, probes, nil
				}
				if a.out.Result == echo.Answered {
					unexpected = a.out
				}
			case <-tick.C:
				break wait
			case <-ctx.Done():
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					if unexpected.Result != "" {
						return time.Time{}, probes, fmt.Errorf("no answer from %s within %s (last other answer: %s)", want, timeout, unexpected)
					}
					return time.Time{}, probes, fmt.Errorf("no answer from %s within %s: %w", want, timeout, context.DeadlineExceeded)
				}
				return time.Time{}, probes, ctx.Err()
			}
		}
		if stop != nil {
			if err := stop(); err != nil {
				return time.Time{}, probes, fmt.Errorf("%w: %w", errGaveUp, err)
			}
		}
	}
}

// connectTime opens one TCP connection to dst from the calling thread's network namespace
// and returns how long connect() took: the SYN's trip through the node's NAT rules and
// the SYN-ACK's back. A blocking socket and a raw syscall keep Go's poller out of the
// measurement.
func connectTime(dst netip.AddrPort, timeout time.Duration) (time.Duration, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer func() { _ = unix.Close(fd) }()
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("SO_SNDTIMEO: %w", err)
	}
	sa := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	start := time.Now()
	err = unix.Connect(fd, sa)
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("connect %s: %w", dst, err)
	}
	return took, nil
}

// firstPacketSamples times n connects to the ClusterIP and n straight to the pod behind
// it, alternating, from client's namespace (after a few warm-up connects of each).
func firstPacketSamples(client *topology.Pod, clusterIP, pod netip.AddrPort, n int) (viaService, direct []time.Duration, failures int, err error) {
	const warmup = 20
	err = client.Do(func() error {
		for i := range n + warmup {
			for _, dst := range []netip.AddrPort{clusterIP, pod} {
				d, err := connectTime(dst, probeTimeout)
				if err != nil {
					failures++
					if failures > n/10+5 {
						return fmt.Errorf("too many failed connects, last: %w", err)
					}
					continue
				}
				if i < warmup {
					continue
				}
				if dst == clusterIP {
					viaService = append(viaService, d)
				} else {
					direct = append(direct, d)
				}
			}
		}
		return nil
	})
	return viaService, direct, failures, err
}
