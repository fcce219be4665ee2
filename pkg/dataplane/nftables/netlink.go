package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/hostnet/nlattr"
)

// This file is the transport: one NETLINK_NETFILTER socket, batches sent in one sendmsg,
// dumps. It does not use google/nftables' Conn.Flush, which at scale fails or crawls
// (measured on 6.18; see README "Why not Conn.Flush"): every message asks for an ack and
// every rule for an echo, so a batch of 500 rules overflows the default receive buffer
// (ENOBUFS), one of 3 000 exceeds the send buffer (EMSGSIZE), and with both buffers
// raised 20 000 messages take 0.7-1.7 s, mostly in 40 000 recvmsg calls; and an error
// cannot be traced back to the message (and so the Service) that caused it. Here only
// the last message of a batch asks for an ack, errors carry our own sequence numbers,
// and the kernel, which processes a batch synchronously inside sendmsg, has queued every
// answer by the time sendmsg returns.

const (
	nfnlSubsysNFTables = unix.NFNL_SUBSYS_NFTABLES
	nlmsgHdrLen        = unix.SizeofNlMsghdr
	nfgenHdrLen        = 4
)

// conn is a netlink socket to nf_tables in the current network namespace.
type conn struct {
	mu  sync.Mutex
	fd  int
	seq uint32
	// sndbuf and rcvbuf are the buffer sizes set so far (they only grow).
	sndbuf, rcvbuf int
	// stats count what went over the socket, for tests and benchmarks.
	stats connStats
	// recvBuf is reused by every exchange (under mu): a full resync dumps hundreds of
	// sets and rules, and a fresh buffer for each was most of a resync's garbage.
	recvBuf []byte
	// gens is the ruleset-generation watch of the socket's network namespace, shared
	// with the other conns opened there (generation.go).
	gens *genWatch
}

// recvBuffer returns the connection's receive buffer; messages read into it must be
// copied before the next exchange (callers hold mu). One datagram of a dump is at most
// 32 KiB (the kernel caps its dump allocations there), answers to a batch are smaller.
func (c *conn) recvBuffer() []byte {
	if c.recvBuf == nil {
		c.recvBuf = make([]byte, 64<<10)
	}
	return c.recvBuf
}

// batchBuffers hold the bytes of batches between the batches of a sync: a cold start
// sends dozens of batches of up to 4 MiB and should not allocate each anew. Each sync lets
// them go when it ends (releaseBatchBuffers), rather than a sync.Pool, which keeps them
// until the second collection after: an idle proxy has few collections, so the cold
// start's megabytes were still alive when the first full resync began, and the collector
// let the heap grow to twice a size that counted them.
var (
	batchBuffersMu sync.Mutex
	batchBuffers   [][]byte
)

// getBatchBuffer returns an empty buffer, with room for n bytes when it is a new one
// (a kept one grows by append when it is short).
func getBatchBuffer(n int) []byte {
	batchBuffersMu.Lock()
	defer batchBuffersMu.Unlock()
	if k := len(batchBuffers); k > 0 {
		b := batchBuffers[k-1]
		batchBuffers[k-1] = nil
		batchBuffers = batchBuffers[:k-1]
		return b[:0]
	}
	return make([]byte, 0, n)
}

// putBatchBuffer gives b back for a later batch of the same sync.
func putBatchBuffer(b []byte) {
	batchBuffersMu.Lock()
	defer batchBuffersMu.Unlock()
	batchBuffers = append(batchBuffers, b[:0])
}

// releaseBatchBuffers lets the collector take the buffers kept for later batches: the
// sync is over.
func releaseBatchBuffers() {
	batchBuffersMu.Lock()
	defer batchBuffersMu.Unlock()
	batchBuffers = nil
}

// connStats counts netlink traffic.
type connStats struct {
	Batches   int // transactions sent
	Messages  int // messages inside batches (without BATCH_BEGIN/END)
	BytesSent int
	Dumps     int // dump requests
	DumpMsgs  int // messages received from dumps
}

func openConn() (*conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("open netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		_ = unix.Close(fd) // the bind error is the one to report
		return nil, fmt.Errorf("bind netlink socket: %w", err)
	}
	// Errors carry only the header of the failed message (we need its sequence number),
	// and extended acks explain what the kernel did not like.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	c := &conn{fd: fd, seq: uint32(os.Getpid()) << 16, gens: genWatchFor(currentNetns())}
	// Dumps of a large table arrive faster than we read them.
	c.growRcvbuf(8 << 20)
	return c, nil
}

func (c *conn) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

func (c *conn) growSndbuf(n int) {
	if n > c.sndbuf {
		// SO_SNDBUFFORCE ignores wmem_max (we are CAP_NET_ADMIN); fall back when not.
		if unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n) != nil {
			_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, n)
		}
		c.sndbuf = n
	}
}

func (c *conn) growRcvbuf(n int) {
	if n > c.rcvbuf {
		if unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n) != nil {
			_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, n)
		}
		c.rcvbuf = n
	}
}

// msgBuilder appends netlink messages and attributes to one buffer.
type msgBuilder struct {
	buf []byte
	// starts holds the offset of each message, nests the offsets of open nested
	// attributes.
	starts []int
	nests  []int
}

func (b *msgBuilder) begin(msgType uint16, flags uint16, family byte) {
	b.starts = append(b.starts, len(b.buf))
	var h [nlmsgHdrLen + nfgenHdrLen]byte
	binary.NativeEndian.PutUint16(h[4:], msgType)
	binary.NativeEndian.PutUint16(h[6:], flags)
	h[16] = family
	h[17] = unix.NFNETLINK_V0
	b.buf = append(b.buf, h[:]...)
}

func (b *msgBuilder) end() {
	start := b.starts[len(b.starts)-1]
	binary.NativeEndian.PutUint32(b.buf[start:], uint32(len(b.buf)-start))
}

func (b *msgBuilder) attr(typ uint16, data []byte) {
	var h [4]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(4+len(data)))
	binary.NativeEndian.PutUint16(h[2:], typ)
	b.buf = append(b.buf, h[:]...)
	b.buf = append(b.buf, data...)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

func (b *msgBuilder) str(typ uint16, s string) {
	data := make([]byte, len(s)+1)
	copy(data, s)
	b.attr(typ, data)
}

func (b *msgBuilder) u32(typ uint16, v uint32) {
	b.attr(typ, binary.BigEndian.AppendUint32(nil, v))
}

func (b *msgBuilder) u64(typ uint16, v uint64) {
	b.attr(typ, binary.BigEndian.AppendUint64(nil, v))
}

func (b *msgBuilder) nest(typ uint16) {
	b.nests = append(b.nests, len(b.buf))
	var h [4]byte
	binary.NativeEndian.PutUint16(h[2:], typ|unix.NLA_F_NESTED)
	b.buf = append(b.buf, h[:]...)
}

// nestLen returns the length so far of the innermost open nest.
func (b *msgBuilder) nestLen() int { return len(b.buf) - b.nests[len(b.nests)-1] }

func (b *msgBuilder) endNest() {
	start := b.nests[len(b.nests)-1]
	b.nests = b.nests[:len(b.nests)-1]
	binary.NativeEndian.PutUint16(b.buf[start:], uint16(len(b.buf)-start))
}

// batchError is the kernel's answer to one message of a failed batch.
type batchError struct {
	// index is the message's position in the batch (0 is the first message after
	// BATCH_BEGIN), or -1 for the batch as a whole.
	index int
	errno syscall.Errno
	msg   string // extended ack message, if any
}

func (e batchError) Error() string {
	if e.msg != "" {
		return fmt.Sprintf("%v (%s)", e.errno, e.msg)
	}
	return e.errno.Error()
}

// errBatchLost means the answers to a batch could not all be read: whether it was
// committed is unknown, and only a fresh read of the kernel can tell.
var errBatchLost = errors.New("lost the kernel's answer to a batch")

// sendBatch sends msgs (the concatenated messages built by a msgBuilder, count of them)
// as one transaction. It returns nil when the kernel committed it, the per-message
// errors when it rejected it (nothing was applied), or another error. It numbers the
// messages in msgs itself (and asks for an ack on the last one): the batch goes out as
// BATCH_BEGIN, msgs and BATCH_END in one sendmsg of three buffers, so that a batch of
// megabytes is not copied once more to put the two around it.
func (c *conn) sendBatch(msgs []byte, count int) ([]batchError, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil, errors.New("netlink socket closed")
	}
	base := c.seq + 1
	c.seq += uint32(count) + 2

	begin, end := batchDelimiter(unix.NFNL_MSG_BATCH_BEGIN, base), batchDelimiter(unix.NFNL_MSG_BATCH_END, base+uint32(count)+1)
	off, lastOff := 0, 0
	for i := 0; i < count; i++ {
		lastOff = off
		setSeq(msgs, off, base+1+uint32(i))
		off += int(binary.NativeEndian.Uint32(msgs[off:]))
	}
	// Only the last message asks for an ack: it arrives after every error of the batch.
	if count > 0 {
		flags := binary.NativeEndian.Uint16(msgs[lastOff+6:])
		binary.NativeEndian.PutUint16(msgs[lastOff+6:], flags|unix.NLM_F_ACK)
	}
	size := len(begin) + len(msgs) + len(end)

	c.growSndbuf(size + 4096)
	// Room for an error per message (header-only errors, ~1 KiB of socket accounting each).
	c.growRcvbuf(min(count*1024+(1<<20), 256<<20))

	// The generations around the commit tell the periodic resync whether someone else
	// committed since (generation.go); without them the watch only loses its trust.
	genBefore, genErr := c.generationLocked()
	n, err := unix.SendmsgBuffers(c.fd, [][]byte{begin, msgs, end}, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
	if err == nil && n != size {
		err = fmt.Errorf("sent %d bytes", n)
	}
	if err != nil {
		return nil, fmt.Errorf("send batch of %d messages (%d bytes): %w", count, size, err)
	}
	c.stats.Batches++
	c.stats.Messages += count
	c.stats.BytesSent += size

	// Everything the kernel has to say is queued already; read it without blocking.
	var errs []batchError
	lastSeq := base + uint32(count)
	acked := false
	rbuf := c.recvBuffer()
	for {
		n, _, err := unix.Recvfrom(c.fd, rbuf, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EWOULDBLOCK {
			break
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if err == unix.ENOBUFS {
				c.gens.doubt()
				return nil, errBatchLost
			}
			c.gens.doubt()
			return nil, fmt.Errorf("read batch answers: %w", err)
		}
		for _, m := range splitMessages(rbuf[:n]) {
			if m.typ != unix.NLMSG_ERROR || len(m.data) < 4+nlmsgHdrLen {
				continue
			}
			errno := -int32(binary.NativeEndian.Uint32(m.data))
			seq := binary.NativeEndian.Uint32(m.data[4+8:])
			if seq < base || seq > base+uint32(count)+1 {
				continue // an answer to something older
			}
			if errno == 0 {
				if seq == lastSeq {
					acked = true
				}
				continue
			}
			idx := int(seq) - int(base) - 1
			if seq == base || idx >= count {
				idx = -1
			}
			errs = append(errs, batchError{index: idx, errno: syscall.Errno(errno), msg: extAckMsg(m.data)})
			if seq == lastSeq {
				acked = true
			}
		}
	}
	lost := !acked && count > 0
	c.noteCommit(genBefore, genErr, count > 0 && len(errs) == 0 && !lost, lost)
	if len(errs) > 0 {
		return errs, nil
	}
	if lost {
		return nil, errBatchLost
	}
	return nil, nil
}

// noteCommit tells the generation watch about a batch just sent (c.mu held): taken by
// the kernel, rejected, or lost (its outcome unknown).
func (c *conn) noteCommit(before uint32, beforeErr error, taken, lost bool) {
	after, err := c.generationLocked()
	if beforeErr != nil || err != nil || lost {
		c.gens.doubt()
		return
	}
	c.gens.committed(before, after, taken)
}

// batchDelimiter returns a BATCH_BEGIN or BATCH_END message of nf_tables' subsystem,
// numbered seq.
func batchDelimiter(msgType uint16, seq uint32) []byte {
	var b msgBuilder
	b.buf = make([]byte, 0, nlmsgHdrLen+nfgenHdrLen)
	b.begin(msgType, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], nfnlSubsysNFTables) // res_id
	b.end()
	setSeq(b.buf, 0, seq)
	return b.buf
}

func setSeq(buf []byte, off int, seq uint32) { binary.NativeEndian.PutUint32(buf[off+8:], seq) }

type nlMsg struct {
	typ   uint16
	flags uint16
	seq   uint32
	data  []byte // after the nlmsghdr
}

func splitMessages(b []byte) []nlMsg {
	var out []nlMsg
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b))
		if l < nlmsgHdrLen || l > len(b) {
			break
		}
		out = append(out, nlMsg{
			typ:   binary.NativeEndian.Uint16(b[4:]),
			flags: binary.NativeEndian.Uint16(b[6:]),
			seq:   binary.NativeEndian.Uint32(b[8:]),
			data:  b[nlmsgHdrLen:l],
		})
		b = b[(l+3)&^3:]
	}
	return out
}

// extAckMsg returns the NLMSGERR_ATTR_MSG of an extended ack, if present.
func extAckMsg(data []byte) string {
	// errno (4) + the original header (16, payload capped by NETLINK_CAP_ACK), then TLVs.
	off := 4 + nlmsgHdrLen
	if len(data) < off {
		return ""
	}
	for it := nlattr.NewIter(data[off:]); it.Next(); {
		if it.Type() == unix.NLMSGERR_ATTR_MSG {
			return nlattr.String(it.Value())
		}
	}
	return ""
}

// sendGetLocked sends one GET request of msgType with the given flags (NLM_F_REQUEST is
// added) under the next sequence number, which it returns. The caller holds c.mu and reads
// the answers.
func (c *conn) sendGetLocked(msgType uint16, flags uint16, family byte, attrs func(b *msgBuilder)) (uint32, error) {
	if c.fd < 0 {
		return 0, errors.New("netlink socket closed")
	}
	c.seq++
	seq := c.seq
	var b msgBuilder
	b.begin(uint16(nfnlSubsysNFTables<<8)|msgType, unix.NLM_F_REQUEST|flags, family)
	if attrs != nil {
		attrs(&b)
	}
	b.end()
	setSeq(b.buf, 0, seq)
	return seq, unix.Sendto(c.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// errDumpInterrupted means the ruleset changed during a dump.
var errDumpInterrupted = errors.New("dump interrupted by a concurrent change")

// dump sends a GET request with NLM_F_DUMP and calls fn for each answer.
func (c *conn) dump(msgType uint16, family byte, attrs func(b *msgBuilder), fn func(m nlMsg) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq, err := c.sendGetLocked(msgType, unix.NLM_F_DUMP, family, attrs)
	if err != nil {
		return fmt.Errorf("send dump request: %w", err)
	}
	c.stats.Dumps++
	rbuf := c.recvBuffer()
	interrupted := false
	for {
		n, _, err := unix.Recvfrom(c.fd, rbuf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("read dump: %w", err)
		}
		for _, m := range splitMessages(rbuf[:n]) {
			if m.seq != seq {
				continue
			}
			if m.flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				if interrupted {
					return errDumpInterrupted
				}
				return nil
			case unix.NLMSG_ERROR:
				if len(m.data) >= 4 {
					if errno := -int32(binary.NativeEndian.Uint32(m.data)); errno != 0 {
						return syscall.Errno(errno)
					}
				}
				return nil
			}
			c.stats.DumpMsgs++
			if err := fn(m); err != nil {
				return err
			}
		}
	}
}

// request sends one non-dump GET and returns the answer (nil when the kernel says
// ENOENT).
func (c *conn) request(msgType uint16, family byte, attrs func(b *msgBuilder)) (*nlMsg, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requestLocked(msgType, family, attrs)
}

// requestLocked is request with c.mu held.
func (c *conn) requestLocked(msgType uint16, family byte, attrs func(b *msgBuilder)) (*nlMsg, error) {
	seq, err := c.sendGetLocked(msgType, unix.NLM_F_ACK, family, attrs)
	if err != nil {
		return nil, fmt.Errorf("send request: %w", err)
	}
	rbuf := c.recvBuffer()
	var answer *nlMsg
	for {
		n, _, err := unix.Recvfrom(c.fd, rbuf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read answer: %w", err)
		}
		for _, m := range splitMessages(rbuf[:n]) {
			if m.seq != seq {
				continue
			}
			if m.typ == unix.NLMSG_ERROR {
				errno := -int32(binary.NativeEndian.Uint32(m.data))
				switch {
				case errno == 0:
					return answer, nil
				case syscall.Errno(errno) == unix.ENOENT:
					return nil, nil
				default:
					return nil, syscall.Errno(errno)
				}
			}
			mm := m
			mm.data = append([]byte(nil), m.data...)
			answer = &mm
		}
	}
}

// attrIter walks netlink attributes (nlattr.Iter, with the current attribute in fields,
// as the readers of this package use it).
type attrIter struct {
	it  nlattr.Iter
	typ uint16
	val []byte
}

func newAttrIter(b []byte) *attrIter { return &attrIter{it: nlattr.NewIter(b)} }

func (it *attrIter) next() bool {
	if !it.it.Next() {
		return false
	}
	it.typ, it.val = it.it.Type(), it.it.Value()
	return true
}

func (it *attrIter) str() string { return nlattr.String(it.val) }

func (it *attrIter) u32() uint32 { return nlattr.Uint32(it.val) }

func (it *attrIter) u64() uint64 { return nlattr.Uint64(it.val) }
