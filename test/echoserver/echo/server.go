package echo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ServerConfig says what an echo server listens on.
type ServerConfig struct {
	// Pod is the name put in every reply.
	Pod string
	// Ports are listened on for every protocol in Protocols, on all addresses of both
	// families (IPv6 only where the namespace has it).
	Ports     []uint16
	Protocols []Protocol
	// Logf, when set, receives one line per listener and per answer.
	Logf func(format string, args ...any)
}

// Server is a running set of listeners; see Listen.
type Server struct {
	cfg     ServerConfig
	streams []streamListener
	packets []packetListener
	// Skipped lists "proto/port/family" listeners that could not be opened because the
	// kernel lacks the protocol or family (SCTP here, IPv6 in a v6-less namespace).
	Skipped []string
}

type streamListener interface {
	acceptReply() (conn io.ReadWriteCloser, reply Reply, err error)
	Close() error
}

type packetListener struct {
	port uint16
	conn net.PacketConn
	// read returns a datagram's source and the address it was sent to; write answers
	// from that address, so that the reply matches the client's conntrack entry.
	read  func(buf []byte) (n int, src net.Addr, dst netip.Addr, err error)
	write func(b []byte, src netip.Addr, to net.Addr) error
}

// Listen opens every listener the config asks for. Call it inside the pod's namespace (the
// echoserver binary is started with `ip netns exec`). A missing IPv6 stack or SCTP module
// skips those listeners and records them in Skipped; any other failure is an error.
func Listen(cfg ServerConfig) (*Server, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	s := &Server{cfg: cfg}
	type family struct {
		name string
		any  netip.Addr
	}
	families := []family{{"ipv4", netip.IPv4Unspecified()}, {"ipv6", netip.IPv6Unspecified()}}
	for _, proto := range cfg.Protocols {
		for _, port := range cfg.Ports {
			for _, fam := range families {
				addr := netip.AddrPortFrom(fam.any, port)
				err := s.listen(proto, addr)
				if err == nil {
					cfg.Logf("listening proto=%s addr=%s", proto, addr)
					continue
				}
				if fam.name == "ipv6" && !ipv6Available() || errors.Is(err, ErrSCTPUnsupported) {
					s.Skipped = append(s.Skipped, fmt.Sprintf("%s/%d/%s", proto, port, fam.name))
					cfg.Logf("skipped proto=%s addr=%s reason=%q", proto, addr, err)
					continue
				}
				s.Close()
				return nil, err
			}
		}
	}
	return s, nil
}

// ipv6Available reports whether the namespace has an IPv6 stack.
func ipv6Available() bool {
	_, err := os.Stat("/proc/net/if_inet6")
	return err == nil
}

func (s *Server) listen(proto Protocol, addr netip.AddrPort) error {
	network := "4"
	if addr.Addr().Is6() {
		network = "6"
	}
	switch proto {
	case TCP:
		l, err := net.Listen("tcp"+network, addr.String())
		if err != nil {
			return fmt.Errorf("listen tcp %s: %w", addr, err)
		}
		s.streams = append(s.streams, tcpListener{l.(*net.TCPListener), s.cfg.Pod})
	case SCTP:
		l, err := listenSCTP(addr)
		if err != nil {
			return err
		}
		s.streams = append(s.streams, sctpStream{l, s.cfg.Pod})
	case UDP:
		c, err := net.ListenPacket("udp"+network, addr.String())
		if err != nil {
			return fmt.Errorf("listen udp %s: %w", addr, err)
		}
		pl, err := newPacketListener(c, addr)
		if err != nil {
			_ = c.Close()
			return err
		}
		s.packets = append(s.packets, pl)
	default:
		return fmt.Errorf("unknown protocol %q", proto)
	}
	return nil
}

func newPacketListener(c net.PacketConn, addr netip.AddrPort) (packetListener, error) {
	pl := packetListener{port: addr.Port(), conn: c}
	if addr.Addr().Is4() {
		p := ipv4.NewPacketConn(c)
		if err := p.SetControlMessage(ipv4.FlagDst, true); err != nil {
			return pl, fmt.Errorf("udp %s: ask for destination addresses: %w", addr, err)
		}
		pl.read = func(buf []byte) (int, net.Addr, netip.Addr, error) {
			n, cm, src, err := p.ReadFrom(buf)
			var dst netip.Addr
			if cm != nil {
				dst, _ = netip.AddrFromSlice(cm.Dst)
			}
			return n, src, dst.Unmap(), err
		}
		pl.write = func(b []byte, src netip.Addr, to net.Addr) error {
			_, err := p.WriteTo(b, &ipv4.ControlMessage{Src: src.AsSlice()}, to)
			return err
		}
		return pl, nil
	}
	p := ipv6.NewPacketConn(c)
	if err := p.SetControlMessage(ipv6.FlagDst, true); err != nil {
		return pl, fmt.Errorf("udp %s: ask for destination addresses: %w", addr, err)
	}
	pl.read = func(buf []byte) (int, net.Addr, netip.Addr, error) {
		n, cm, src, err := p.ReadFrom(buf)
		var dst netip.Addr
		if cm != nil {
			dst, _ = netip.AddrFromSlice(cm.Dst)
		}
		return n, src, dst, err
	}
	pl.write = func(b []byte, src netip.Addr, to net.Addr) error {
		_, err := p.WriteTo(b, &ipv6.ControlMessage{Src: src.AsSlice()}, to)
		return err
	}
	return pl, nil
}

// Serve answers until ctx is done, then closes every listener. It returns the first
// listener failure other than the shutdown itself.
func (s *Server) Serve(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(s.streams)+len(s.packets))
	for _, l := range s.streams {
		wg.Go(func() { errs <- s.serveStream(ctx, l) })
	}
	for _, l := range s.packets {
		wg.Go(func() { errs <- s.servePackets(ctx, l) })
	}
	<-ctx.Done()
	s.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Close closes every listener.
func (s *Server) Close() {
	for _, l := range s.streams {
		_ = l.Close()
	}
	for _, l := range s.packets {
		_ = l.conn.Close()
	}
}

// idleTimeout bounds how long an answered stream connection stays open waiting for more
// lines, so that abandoned clients do not pile up. It is longer than any case that holds a
// connection open across a disruption can take: the conformance suite's proxy restart keeps
// one idle while it waits, check by check, for the new process to converge (each check up
// to its convergence limit, 90 s in the emulated VM), and a connection closed by the server
// there would read as a connection the restart broke.
const idleTimeout = 10 * time.Minute

func (s *Server) serveStream(ctx context.Context, l streamListener) error {
	for {
		conn, reply, err := l.acceptReply()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
				return nil
			}
			s.cfg.Logf("accept failed: %v", err)
			continue
		}
		go s.answerStream(conn, reply)
	}
}

// answerStream writes the reply line at once, then one more for every line the client
// sends, until the client closes or stays idle.
func (s *Server) answerStream(conn io.ReadWriteCloser, reply Reply) {
	defer conn.Close()
	line := []byte(reply.String() + "\n")
	s.cfg.Logf("answer %s", reply)
	if _, err := conn.Write(line); err != nil {
		return
	}
	type deadliner interface{ SetReadDeadline(time.Time) error }
	r := bufio.NewReader(conn)
	for {
		if d, ok := conn.(deadliner); ok {
			_ = d.SetReadDeadline(time.Now().Add(idleTimeout))
		}
		if _, err := r.ReadString('\n'); err != nil {
			return
		}
		if _, err := conn.Write(line); err != nil {
			return
		}
	}
}

func (s *Server) servePackets(ctx context.Context, l packetListener) error {
	buf := make([]byte, 2048)
	for {
		_, src, dst, err := l.read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.cfg.Logf("udp read failed: %v", err)
			continue
		}
		remote := src.(*net.UDPAddr).AddrPort()
		reply := Reply{
			Pod:      s.cfg.Pod,
			Local:    netip.AddrPortFrom(dst, l.port),
			Remote:   netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port()),
			Protocol: UDP,
		}
		s.cfg.Logf("answer %s", reply)
		if err := l.write([]byte(reply.String()+"\n"), dst, src); err != nil {
			s.cfg.Logf("udp write to %s failed: %v", src, err)
		}
	}
}

type tcpListener struct {
	l   *net.TCPListener
	pod string
}

func (t tcpListener) acceptReply() (io.ReadWriteCloser, Reply, error) {
	c, err := t.l.AcceptTCP()
	if err != nil {
		return nil, Reply{}, err
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	remote := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	return c, Reply{
		Pod:      t.pod,
		Local:    netip.AddrPortFrom(local.Addr().Unmap(), local.Port()),
		Remote:   netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port()),
		Protocol: TCP,
	}, nil
}

func (t tcpListener) Close() error { return t.l.Close() }

type sctpStream struct {
	l   *sctpListener
	pod string
}

func (s sctpStream) acceptReply() (io.ReadWriteCloser, Reply, error) {
	f, local, remote, err := s.l.accept()
	if err != nil {
		return nil, Reply{}, err
	}
	return f, Reply{Pod: s.pod, Local: local, Remote: remote, Protocol: SCTP}, nil
}

func (s sctpStream) Close() error { return s.l.Close() }
