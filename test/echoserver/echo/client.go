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
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Result classifies what a client received.
type Result string

// The results a probe can have.
const (
	// Answered: the echo server replied; Outcome.Reply says who and what it saw.
	Answered Result = "answered"
	// Refused: something actively refused the connection (TCP RST, SCTP ABORT, ICMP port
	// unreachable). This is what a Service without endpoints looks like.
	Refused Result = "refused"
	// Timeout: nothing came back before the deadline; the packet was dropped somewhere.
	Timeout Result = "timeout"
	// Unreachable: ICMP host/net unreachable or admin-prohibited came back (IPv4 reports a
	// prohibition as EHOSTUNREACH, IPv6 as EACCES), or the client had no route.
	Unreachable Result = "unreachable"
	// Failed: anything else (a malformed reply, an unexpected socket error).
	Failed Result = "failed"
)

// Outcome is the result of one probe.
type Outcome struct {
	Result Result
	// Reply is set when Result is Answered.
	Reply Reply
	// Err is the underlying error for every other result.
	Err error
	// SYNRetransmits is how many times a TCP client sent its SYN again before the outcome
	// (the kernel's tcpi_total_retrans of the connecting socket). A refusal normally comes
	// back on the first SYN; on Linux 6.18 an IPv6 client that is refused with ICMPv6 port
	// unreachable, rather than a TCP RST, learns of it only when its SYN is retransmitted
	// (one second later), the first error counting as a soft one.
	SYNRetransmits int
}

// String renders the outcome on one line, e.g. "answered pod=a0 ..." or "refused: ...".
func (o Outcome) String() string {
	if o.Result == Answered {
		return "answered " + o.Reply.String()
	}
	s := string(o.Result)
	if o.SYNRetransmits > 0 {
		s += fmt.Sprintf(" after %d SYN retransmission(s)", o.SYNRetransmits)
	}
	if o.Err != nil {
		s += fmt.Sprintf(": %v", o.Err)
	}
	return s
}

// DefaultTimeout is how long a probe waits for an answer when the caller gives no timeout.
// It is above the kernel's 1s initial SYN retransmission timeout, so that one lost SYN
// (for example to a rule that was being replaced) does not read as a drop.
const DefaultTimeout = 1500 * time.Millisecond

// ProbeOptions tune a probe.
type ProbeOptions struct {
	// Timeout bounds the whole probe (connect plus reply). Zero means DefaultTimeout.
	Timeout time.Duration
	// Source, when valid, is bound as the client's source address (a secondary address of
	// the client, to test loadBalancerSourceRanges for instance).
	Source netip.Addr
}

func (o ProbeOptions) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return DefaultTimeout
}

// Probe opens one connection (TCP, SCTP) or sends one datagram from a fresh socket (UDP) to
// target and classifies what comes back. Run it inside the client's network namespace.
func Probe(ctx context.Context, proto Protocol, target netip.AddrPort, opts ProbeOptions) Outcome {
	ctx, cancel := context.WithTimeout(ctx, opts.timeout())
	defer cancel()
	switch proto {
	case TCP:
		return probeTCP(ctx, target, opts.Source)
	case UDP:
		c, err := DialUDP(target, opts.Source)
		if err != nil {
			return classify(err)
		}
		defer c.Close()
		return c.exchange(ctx)
	case SCTP:
		return probeSCTP(ctx, target, opts.Source)
	}
	return Outcome{Result: Failed, Err: fmt.Errorf("unknown protocol %q", proto)}
}

func probeTCP(ctx context.Context, target netip.AddrPort, source netip.Addr) Outcome {
	// A duplicate of the socket's descriptor outlives the one the dialer closes on failure,
	// so that the socket's TCP_INFO can still be read: it tells how many SYNs went out.
	dup := -1
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		cerr := c.Control(func(fd uintptr) { dup, err = unix.Dup(int(fd)) })
		return errors.Join(cerr, err)
	}}
	if source.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: source.AsSlice()}
	}
	conn, err := d.DialContext(ctx, "tcp", target.String())
	if dup >= 0 {
		defer func() { _ = unix.Close(dup) }()
	}
	if err != nil {
		out := classify(err)
		if dup >= 0 {
			if info, ierr := unix.GetsockoptTCPInfo(dup, unix.IPPROTO_TCP, unix.TCP_INFO); ierr == nil {
				out.SYNRetransmits = int(info.Total_retrans)
			}
		}
		return out
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	return readReply(conn)
}

// readReply reads one reply line from a connected stream.
func readReply(conn io.Reader) Outcome {
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		if line == "" {
			return classify(fmt.Errorf("connected, but no reply: %w", err))
		}
	}
	return parseOutcome(line)
}

func parseOutcome(line string) Outcome {
	r, err := ParseReply(strings.TrimSpace(line))
	if err != nil {
		return Outcome{Result: Failed, Err: err}
	}
	return Outcome{Result: Answered, Reply: r}
}

// classify maps a socket error to a Result.
func classify(err error) Outcome {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return Outcome{Result: Refused, Err: err}
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.EACCES):
		return Outcome{Result: Unreachable, Err: err}
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ETIMEDOUT):
		return Outcome{Result: Timeout, Err: err}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Outcome{Result: Timeout, Err: err}
	}
	return Outcome{Result: Failed, Err: err}
}

// UDPClient is a connected UDP socket that keeps its source port across sends, to test
// what happens to an existing UDP flow (its conntrack entry) when the Service changes.
type UDPClient struct {
	conn *net.UDPConn
}

// DialUDP creates a UDP socket connected to target, bound to source when source is valid.
// Call it inside the client's network namespace; Send may then be called from anywhere.
func DialUDP(target netip.AddrPort, source netip.Addr) (*UDPClient, error) {
	var laddr *net.UDPAddr
	if source.IsValid() {
		laddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(source, 0))
	}
	conn, err := net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(target))
	if err != nil {
		return nil, fmt.Errorf("dial udp %s: %w", target, err)
	}
	return &UDPClient{conn: conn}, nil
}

// LocalAddr is the socket's source address and port.
func (c *UDPClient) LocalAddr() netip.AddrPort {
	return c.conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Send sends one datagram and waits up to timeout (zero: DefaultTimeout) for the reply.
func (c *UDPClient) Send(timeout time.Duration) Outcome {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.exchange(ctx)
}

func (c *UDPClient) exchange(ctx context.Context) Outcome {
	buf := make([]byte, 1024)
	c.drain(buf)
	deadline, _ := ctx.Deadline()
	_ = c.conn.SetDeadline(deadline)
	if _, err := c.conn.Write([]byte("probe\n")); err != nil {
		return classify(err)
	}
	n, err := c.conn.Read(buf)
	if err != nil {
		return classify(err)
	}
	return parseOutcome(string(buf[:n]))
}

// drain discards answers that arrived after an earlier Send gave up waiting, so that they
// are not taken for the answer to the next one (answers carry no sequence number).
func (c *UDPClient) drain(buf []byte) {
	raw, err := c.conn.SyscallConn()
	if err != nil {
		return
	}
	_ = c.conn.SetReadDeadline(time.Time{})
	_ = raw.Read(func(fd uintptr) bool {
		// A pending ICMP error is consumed here too: it belongs to an earlier send. The
		// bound keeps a socket that fails in some other way from looping forever.
		for range 64 {
			if _, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT); err == unix.EAGAIN {
				break
			}
		}
		return true
	})
}

// Close closes the socket.
func (c *UDPClient) Close() error { return c.conn.Close() }
