package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/hostnet/nlattr"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// ctnetlink, from include/uapi/linux/netfilter/nfnetlink_conntrack.h. The netlink
// package's own conntrack functions read the whole table into memory before filtering (the
// 1.32 reconciler's 12 GB, https://issues.k8s.io/129982) and parse no SCTP ports, so the
// dump is driven here over its request and socket types.
const (
	nfnlSubsysCTNetlink = 1
	ctMsgGet            = 1
	ctMsgDelete         = 2

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaFilter     = 25

	// ipsSeenReply is the status bit set once a packet went the reply way.
	ipsSeenReply = 1 << 1

	ctaTupleIP    = 1
	ctaTupleProto = 2

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3

	ctaFilterOrigFlags  = 1
	ctaFilterReplyFlags = 2
	// ctaFilterFlagProtoNum asks the kernel (5.9 and later) to dump only entries whose
	// original tuple has the given protocol. Older kernels ignore the filter; entries
	// are matched in full here anyway.
	ctaFilterFlagProtoNum = 1 << 3
)

// maxDumpAttempts bounds the retries of a dump the kernel marked interrupted (the table
// changed under it): entries may have been missed, so the walk starts over.
const maxDumpAttempts = 5

// netlinkTable is the kernel's conntrack table in this network namespace.
type netlinkTable struct{}

func familyByte(f model.IPFamily) uint8 {
	if f == model.IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// Walk streams the table through visit, deleting an entry as soon as visit says so, over a
// second socket (the dump's socket is busy until the dump ends). Deleting entries the dump
// has already passed is safe; an entry deleted twice (it went away meanwhile) is not
// counted.
func (netlinkTable) Walk(ctx context.Context, family model.IPFamily, protocol uint8, visit func(*Flow) bool) (int, error) {
	del, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	defer del.Close()
	delSockets := map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: del}}
	fam := familyByte(family)

	deleted := 0
	var walkErr error
	for attempt := 0; attempt < maxDumpAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		walkErr = nil
		req := nl.NewNetlinkRequest(nfnlSubsysCTNetlink<<8|ctMsgGet, unix.NLM_F_DUMP)
		req.AddData(&nl.Nfgenmsg{NfgenFamily: fam, Version: nl.NFNETLINK_V0})
		orig := nl.NewRtAttr(ctaTupleOrig|unix.NLA_F_NESTED, nil)
		proto := orig.AddRtAttr(ctaTupleProto|unix.NLA_F_NESTED, nil)
		proto.AddRtAttr(ctaProtoNum, []byte{protocol})
		req.AddData(orig)
		filter := nl.NewRtAttr(ctaFilter|unix.NLA_F_NESTED, nil)
		filter.AddRtAttr(ctaFilterOrigFlags, nl.Uint32Attr(ctaFilterFlagProtoNum))
		filter.AddRtAttr(ctaFilterReplyFlags, nl.Uint32Attr(0))
		req.AddData(filter)

		err := req.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
			f, ok := parseFlow(msg)
			if !ok || f.Protocol != protocol || !visit(&f) {
				return true
			}
			d := nl.NewNetlinkRequest(nfnlSubsysCTNetlink<<8|ctMsgDelete, unix.NLM_F_ACK)
			d.Sockets = delSockets
			// The entry's own attributes identify it (tuples, zone and id): the kernel
			// deletes exactly this entry, not a newer one with the same tuple.
			d.AddRawData(msg)
			if _, err := d.Execute(unix.NETLINK_NETFILTER, 0); err == nil {
				deleted++
			} else if !errors.Is(err, unix.ENOENT) && walkErr == nil {
				walkErr = fmt.Errorf("deleting a conntrack entry: %w", err)
			}
			return true
		})
		if errors.Is(err, nl.ErrDumpInterrupted) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return deleted, fmt.Errorf("dumping conntrack entries: %w", err)
		}
		return deleted, walkErr
	}
	return deleted, fmt.Errorf("dumping conntrack entries: interrupted %d times in a row", maxDumpAttempts)
}

// parseFlow reads the tuples of one ctnetlink message (after the netlink header).
func parseFlow(msg []byte) (Flow, bool) {
	var f Flow
	if len(msg) < nl.SizeofNfgenmsg {
		return f, false
	}
	var okOrig, okReply bool
	nlattr.Walk(msg[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
		switch typ {
		case ctaTupleOrig:
			f.Orig, f.Protocol, okOrig = parseTuple(v)
		case ctaTupleReply:
			f.Reply, _, okReply = parseTuple(v)
		case ctaStatus:
			if len(v) >= 4 {
				f.Replied = binary.BigEndian.Uint32(v)&ipsSeenReply != 0
			}
		}
	})
	return f, okOrig && okReply
}

func parseTuple(b []byte) (Tuple, uint8, bool) {
	var src, dst netip.Addr
	var sport, dport uint16
	var proto uint8
	nlattr.Walk(b, func(typ uint16, v []byte) {
		switch typ {
		case ctaTupleIP:
			nlattr.Walk(v, func(t uint16, a []byte) {
				addr, ok := netip.AddrFromSlice(a)
				if !ok {
					return
				}
				switch t {
				case ctaIPv4Src, ctaIPv6Src:
					src = addr
				case ctaIPv4Dst, ctaIPv6Dst:
					dst = addr
				}
			})
		case ctaTupleProto:
			nlattr.Walk(v, func(t uint16, a []byte) {
				switch {
				case t == ctaProtoNum && len(a) >= 1:
					proto = a[0]
				case t == ctaProtoSrcPort && len(a) >= 2:
					sport = binary.BigEndian.Uint16(a)
				case t == ctaProtoDstPort && len(a) >= 2:
					dport = binary.BigEndian.Uint16(a)
				}
			})
		}
	})
	if !src.IsValid() || !dst.IsValid() {
		return Tuple{}, 0, false
	}
	return Tuple{Src: netip.AddrPortFrom(src, sport), Dst: netip.AddrPortFrom(dst, dport)}, proto, true
}
