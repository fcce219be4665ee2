package echo

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The standard library has no SCTP, so SCTP uses one-to-one (SOCK_STREAM) sockets through
// raw syscalls. Their descriptors are non-blocking and wrapped in an *os.File, which puts
// them on Go's poller: deadlines then work as they do for TCP.

// SCTPSupported reports whether the kernel offers SCTP sockets in the calling thread's
// network namespace (it does not when the sctp module is absent, as on sluice's CI kernel).
func SCTPSupported() bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return false
	}
	_ = unix.Close(fd)
	return true
}

// ErrSCTPUnsupported is returned when the kernel has no SCTP sockets.
var ErrSCTPUnsupported = errors.New("kernel has no SCTP sockets")

func sctpSocket(family int) (int, error) {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
			return -1, ErrSCTPUnsupported
		}
		return -1, fmt.Errorf("sctp socket: %w", err)
	}
	return fd, nil
}

func familyOf(a netip.Addr) int {
	if a.Unmap().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func toSockaddr(ap netip.AddrPort) unix.Sockaddr {
	a := ap.Addr().Unmap()
	if a.Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
}

func fromSockaddr(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

func probeSCTP(ctx context.Context, target netip.AddrPort, source netip.Addr) Outcome {
	fd, err := sctpSocket(familyOf(target.Addr()))
	if err != nil {
		return Outcome{Result: Failed, Err: err}
	}
	if source.IsValid() {
		if err := unix.Bind(fd, toSockaddr(netip.AddrPortFrom(source, 0))); err != nil {
			_ = unix.Close(fd)
			return Outcome{Result: Failed, Err: fmt.Errorf("bind %s: %w", source, err)}
		}
	}
	f := os.NewFile(uintptr(fd), "sctp")
	defer f.Close()
	deadline, _ := ctx.Deadline()
	_ = f.SetDeadline(deadline)

	if err := unix.Connect(fd, toSockaddr(target)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return classify(err)
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return Outcome{Result: Failed, Err: err}
	}
	if err := awaitAssociation(raw); err != nil {
		return classify(err)
	}
	return readReply(f)
}

// awaitAssociation waits until a connecting one-to-one SCTP socket's association is
// established, or has failed (the error), or the socket's deadline passes.
//
// Each call of the callback looks at the socket before RawConn.Write is let to wait for
// writability, never the other way round: RawConn.Write clears the readiness the poller
// recorded before it was called, and an SCTP socket turns writable exactly once, when its
// association comes up. A wait armed without looking first misses an association that came
// up between connect and the wait (the handshake outrunning the goroutine, which happens
// under load and all the time in the emulated IPVS VM): the probe then times out while the
// answer sits in the socket.
func awaitAssociation(raw syscall.RawConn) error {
	var connErr error
	werr := raw.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			connErr = err
			return true
		}
		switch e := syscall.Errno(v); e {
		case 0, unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
		default:
			connErr = e
			return true
		}
		// The socket has a peer name once the association is established; before that
		// getpeername fails with ENOTCONN and the wait goes on.
		_, err = unix.Getpeername(int(fd))
		return err == nil
	})
	if werr != nil {
		return werr
	}
	return connErr
}

// sctpListener accepts SCTP associations on one address.
type sctpListener struct {
	f *os.File
}

func listenSCTP(addr netip.AddrPort) (*sctpListener, error) {
	fd, err := sctpSocket(familyOf(addr.Addr()))
	if err != nil {
		return nil, err
	}
	if familyOf(addr.Addr()) == unix.AF_INET6 {
		// One socket per family, as for TCP and UDP: the IPv4 one answers IPv4.
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, toSockaddr(addr)); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("bind sctp %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("listen sctp %s: %w", addr, err)
	}
	return &sctpListener{f: os.NewFile(uintptr(fd), "sctp-listener")}, nil
}

// accept waits for the next association and returns it with its local and remote address.
func (l *sctpListener) accept() (*os.File, netip.AddrPort, netip.AddrPort, error) {
	raw, err := l.f.SyscallConn()
	if err != nil {
		return nil, netip.AddrPort{}, netip.AddrPort{}, err
	}
	var nfd int
	var remote unix.Sockaddr
	var acceptErr error
	err = raw.Read(func(fd uintptr) bool {
		nfd, remote, acceptErr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return !errors.Is(acceptErr, unix.EAGAIN)
	})
	if err == nil {
		err = acceptErr
	}
	if err != nil {
		return nil, netip.AddrPort{}, netip.AddrPort{}, err
	}
	local, err := unix.Getsockname(nfd)
	if err != nil {
		_ = unix.Close(nfd)
		return nil, netip.AddrPort{}, netip.AddrPort{}, fmt.Errorf("getsockname: %w", err)
	}
	return os.NewFile(uintptr(nfd), "sctp-conn"), fromSockaddr(local), fromSockaddr(remote), nil
}

func (l *sctpListener) Close() error { return l.f.Close() }
