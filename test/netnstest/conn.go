package netnstest

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"
)

// In runs fn in the named namespace (see Do), or directly when name is "": in the
// process's own namespace, which under Main is the test's private node.
func In(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	return Do(name, fn)
}

// Dial connects over network ("tcp" or "udp") from namespace ns ("" for the process's
// own) to addr, from the source address src when it is valid. The connection's socket
// stays in ns.
func Dial(ns, network string, src netip.Addr, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := In(ns, func() error {
		d := net.Dialer{Timeout: timeout}
		if src.IsValid() {
			switch network {
			case "udp", "udp4", "udp6":
				d.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
			default:
				d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
			}
		}
		var err error
		c, err = d.Dial(network, addr)
		return err
	})
	return c, err
}

// ServeTCP listens on addr (":80") in namespace ns and answers every connection with
// answer(peer address), then closes it. The listener closes when the test ends.
func ServeTCP(t testing.TB, ns, addr string, answer func(peer netip.Addr) string) {
	t.Helper()
	var ln net.Listener
	listenIn(t, ns, "tcp", addr, func() (err error) { ln, err = net.Listen("tcp", addr); return err })
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprint(c, answer(c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()))
			}()
		}
	}()
}

// ServeUDP listens on addr (":53") in namespace ns and answers every datagram with
// answer(peer address). The socket closes when the test ends.
func ServeUDP(t testing.TB, ns, addr string, answer func(peer netip.Addr) string) {
	t.Helper()
	var pc net.PacketConn
	listenIn(t, ns, "udp", addr, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err })
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(answer(from.(*net.UDPAddr).AddrPort().Addr().Unmap())), from)
		}
	}()
}

// listenIn runs open (which opens a listener on network addr) in namespace ns and fails
// the test if it fails.
func listenIn(t testing.TB, ns, network, addr string, open func() error) {
	t.Helper()
	if err := In(ns, open); err != nil {
		t.Fatalf("listening on %s %s in %s: %v", network, addr, ns, err)
	}
}
