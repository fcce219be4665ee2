package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// The seams between the backend and the kernel. Each is small and speaks the backend's
// types; the real implementations below translate to moby/ipvs and vishvananda/netlink, and
// the unit tests substitute a stateful fake kernel (fake_test.go).
//
// Errors: an operation whose object already exists returns an error matching errExist, one
// whose object is missing errNotExist, so that the applier can make every operation
// idempotent whatever the kernel's errno.

var (
	errExist    = errors.New("already exists")
	errNotExist = errors.New("does not exist")
	// errNoScheduler is IPVS refusing a virtual server because the kernel has no module for
	// its scheduler (IPVS answers ENOENT, where a missing service is ESRCH).
	errNoScheduler = errors.New("scheduler not available in this kernel")
)

// kernelError wraps a kernel error, adding errExist or errNotExist when it means that.
type kernelError struct {
	err  error
	kind error // errExist, errNotExist or nil
}

func (e *kernelError) Error() string { return e.err.Error() }
func (e *kernelError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.err, e.kind}
}

func classify(err error, exist, notExist []error) error {
	if err == nil {
		return nil
	}
	for _, e := range exist {
		if errors.Is(err, e) {
			return &kernelError{err: err, kind: errExist}
		}
	}
	for _, e := range notExist {
		if errors.Is(err, e) {
			return &kernelError{err: err, kind: errNotExist}
		}
	}
	return err
}

// ipvsKernel is the IPVS table of the network namespace.
type ipvsKernel interface {
	// Services lists every virtual server (both families, firewall-mark ones left out).
	Services() (map[vsKey]vsParams, error)
	Destinations(k vsKey) ([]realServer, error)
	AddService(k vsKey, p vsParams) error
	UpdateService(k vsKey, p vsParams) error
	DeleteService(k vsKey) error
	AddDestination(k vsKey, rs netip.AddrPort, weight int) error
	UpdateDestination(k vsKey, rs netip.AddrPort, weight int) error
	DeleteDestination(k vsKey, rs netip.AddrPort) error
	// SetTimeouts sets the TCP, TCP FIN and UDP connection timeouts; 0 leaves one alone.
	SetTimeouts(tcp, tcpFin, udp time.Duration) error
}

// linkAddr is an address and the link holding it.
type linkAddr struct {
	addr netip.Addr
	link string
}

// linkKernel is the dummy device and the node's addresses.
type linkKernel interface {
	// Dummy reports whether the device exists and its addresses (both families).
	Dummy(name string) (exists bool, addrs []netip.Addr, err error)
	CreateDummy(name string) error
	DeleteLink(name string) error
	AddAddr(name string, a netip.Addr) error
	DelAddr(name string, a netip.Addr) error
	// Addrs lists every address of the namespace with its link.
	Addrs() ([]linkAddr, error)
}

// ipsetKernel is the ipset subsystem.
type ipsetKernel interface {
	// List returns a set with its entries, or errNotExist.
	List(name string) (*kernelSet, error)
	Create(name string, t ipsetType, family model.IPFamily) error
	Destroy(name string) error
	Add(name string, t ipsetType, e setEntry) error
	Del(name string, t ipsetType, e setEntry) error
}

// --- IPVS through moby/ipvs -----------------------------------------------------------------

type mobyIPVS struct{ h *mobyipvs.Handle }

// newMobyIPVS opens an IPVS handle in the current network namespace.
func newMobyIPVS() (*mobyIPVS, error) {
	h, err := mobyipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("open IPVS: %w", err)
	}
	return &mobyIPVS{h: h}, nil
}

func (m *mobyIPVS) close() { m.h.Close() }

func toMobyService(k vsKey, p vsParams) *mobyipvs.Service {
	s := &mobyipvs.Service{
		Address:   net.IP(k.Addr.AsSlice()),
		Protocol:  uint16(protoNumber(k.Proto)),
		Port:      k.Port,
		SchedName: p.Scheduler,
		Flags:     p.Flags,
		Timeout:   p.Timeout,
	}
	if k.Addr.Is4() {
		s.AddressFamily, s.Netmask = unix.AF_INET, 0xffffffff
	} else {
		s.AddressFamily, s.Netmask = unix.AF_INET6, 128
	}
	return s
}

// IPVS's "no such service" is ESRCH, "no such destination" ENOENT; adding either twice is
// EEXIST.
var (
	ipvsExist    = []error{unix.EEXIST}
	ipvsNotExist = []error{unix.ESRCH, unix.ENOENT}
)

func (m *mobyIPVS) Services() (map[vsKey]vsParams, error) {
	svcs, err := m.h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("list IPVS services: %w", err)
	}
	out := make(map[vsKey]vsParams, len(svcs))
	for _, s := range svcs {
		if s.FWMark != 0 || s.Address == nil {
			continue
		}
		proto, ok := protoFromNumber(s.Protocol)
		addr, ok2 := netip.AddrFromSlice(s.Address)
		if !ok || !ok2 {
			continue
		}
		if s.AddressFamily == unix.AF_INET {
			addr = addr.Unmap()
		}
		out[vsKey{Proto: proto, Addr: addr, Port: s.Port}] = vsParams{Scheduler: s.SchedName, Flags: s.Flags &^ flagHashed, Timeout: s.Timeout}
	}
	return out, nil
}

func (m *mobyIPVS) Destinations(k vsKey) ([]realServer, error) {
	ds, err := m.h.GetDestinations(toMobyService(k, vsParams{}))
	if err != nil {
		return nil, classify(fmt.Errorf("list real servers of %s: %w", k, err), nil, ipvsNotExist)
	}
	out := make([]realServer, 0, len(ds))
	for _, d := range ds {
		addr, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		if d.AddressFamily == unix.AF_INET {
			addr = addr.Unmap()
		}
		out = append(out, realServer{Addr: netip.AddrPortFrom(addr, d.Port), Weight: d.Weight, Active: d.ActiveConnections, Inactive: d.InactiveConnections})
	}
	return out, nil
}

func (m *mobyIPVS) AddService(k vsKey, p vsParams) error {
	return classifyService(m.h.NewService(toMobyService(k, p)))
}

func (m *mobyIPVS) UpdateService(k vsKey, p vsParams) error {
	return classifyService(m.h.UpdateService(toMobyService(k, p)))
}

// classifyService tells a missing scheduler module (ENOENT) from a missing service (ESRCH).
func classifyService(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return &kernelError{err: err, kind: errNoScheduler}
	}
	return classify(err, ipvsExist, []error{unix.ESRCH})
}

func (m *mobyIPVS) DeleteService(k vsKey) error {
	return classify(m.h.DelService(toMobyService(k, vsParams{})), ipvsExist, ipvsNotExist)
}

func toMobyDestination(rs netip.AddrPort, weight int) *mobyipvs.Destination {
	d := &mobyipvs.Destination{
		Address:         net.IP(rs.Addr().AsSlice()),
		Port:            rs.Port(),
		Weight:          weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
		AddressFamily:   unix.AF_INET,
	}
	if rs.Addr().Is6() {
		d.AddressFamily = unix.AF_INET6
	}
	return d
}

func (m *mobyIPVS) AddDestination(k vsKey, rs netip.AddrPort, weight int) error {
	return classify(m.h.NewDestination(toMobyService(k, vsParams{}), toMobyDestination(rs, weight)), ipvsExist, ipvsNotExist)
}

func (m *mobyIPVS) UpdateDestination(k vsKey, rs netip.AddrPort, weight int) error {
	return classify(m.h.UpdateDestination(toMobyService(k, vsParams{}), toMobyDestination(rs, weight)), ipvsExist, ipvsNotExist)
}

func (m *mobyIPVS) DeleteDestination(k vsKey, rs netip.AddrPort) error {
	return classify(m.h.DelDestination(toMobyService(k, vsParams{}), toMobyDestination(rs, 0)), ipvsExist, ipvsNotExist)
}

func (m *mobyIPVS) SetTimeouts(tcp, tcpFin, udp time.Duration) error {
	return m.h.SetConfig(&mobyipvs.Config{TimeoutTCP: tcp, TimeoutTCPFin: tcpFin, TimeoutUDP: udp})
}

// openNetlink opens a handle of the one netlink protocol proto (what names it in the
// error) for a seam holding just the handle: without a protocol list netlink also opens
// XFRM and netfilter sockets, which fails on kernels without xfrm_user loaded.
func openNetlink[T ~struct{ h *netlink.Handle }](proto int, what string) (*T, error) {
	h, err := netlink.NewHandle(proto)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", what, err)
	}
	return &T{h: h}, nil
}

// --- links and addresses through rtnetlink --------------------------------------------------

type netlinkLinks struct{ h *netlink.Handle }

func newNetlinkLinks() (*netlinkLinks, error) {
	return openNetlink[netlinkLinks](unix.NETLINK_ROUTE, "rtnetlink")
}

func (n *netlinkLinks) close() { n.h.Close() }

// linkByName looks up a link; a missing one is errNotExist, which removal ignores and
// Dummy reports as absent.
func (n *netlinkLinks) linkByName(name string) (netlink.Link, error) {
	link, err := n.h.LinkByName(name)
	if err != nil {
		err = fmt.Errorf("look up %s: %w", name, err)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, &kernelError{err: err, kind: errNotExist}
		}
		return nil, err
	}
	return link, nil
}

func (n *netlinkLinks) Dummy(name string) (bool, []netip.Addr, error) {
	link, err := n.linkByName(name)
	if errors.Is(err, errNotExist) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	addrs, err := n.h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return true, nil, fmt.Errorf("list addresses of %s: %w", name, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return true, out, nil
}

func (n *netlinkLinks) CreateDummy(name string) error {
	err := n.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
	return classify(err, []error{unix.EEXIST}, nil)
}

func (n *netlinkLinks) DeleteLink(name string) error {
	link, err := n.linkByName(name)
	if err != nil {
		return err
	}
	return classify(n.h.LinkDel(link), nil, []error{unix.ENODEV})
}

func hostPrefix(a netip.Addr) *netlink.Addr {
	bits := 32
	if a.Is6() {
		bits = 128
	}
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, bits)}}
}

func (n *netlinkLinks) AddAddr(name string, a netip.Addr) error {
	link, err := n.linkByName(name)
	if err != nil {
		return err
	}
	return classify(n.h.AddrAdd(link, hostPrefix(a)), []error{unix.EEXIST}, nil)
}

func (n *netlinkLinks) DelAddr(name string, a netip.Addr) error {
	link, err := n.linkByName(name)
	if err != nil {
		return err
	}
	return classify(n.h.AddrDel(link, hostPrefix(a)), nil, []error{unix.EADDRNOTAVAIL, unix.ENODEV})
}

func (n *netlinkLinks) Addrs() ([]linkAddr, error) {
	links, err := n.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	addrs, err := n.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	out := make([]linkAddr, 0, len(addrs))
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		out = append(out, linkAddr{addr: ip.Unmap(), link: names[a.LinkIndex]})
	}
	return out, nil
}

// --- ipsets through netfilter netlink ------------------------------------------------------

type netlinkIPSets struct{ h *netlink.Handle }

func newNetlinkIPSets() (*netlinkIPSets, error) {
	return openNetlink[netlinkIPSets](unix.NETLINK_NETFILTER, "netfilter netlink")
}

func (n *netlinkIPSets) close() { n.h.Close() }

// ipset's errors: "set does not exist" is ENOENT, "element exists" on add and "element
// missing" on del are both IPSET_ERR_EXIST, creating an existing set is EEXIST (with
// NLM_F_EXCL), and a kernel without ip_set answers EPROTONOSUPPORT or ENOENT.
var (
	ipsetNotExist = []error{unix.ENOENT, unix.EPROTONOSUPPORT}
)

func (n *netlinkIPSets) List(name string) (*kernelSet, error) {
	res, err := n.h.IpsetList(name)
	if err != nil {
		return nil, classify(fmt.Errorf("list ipset %s: %w", name, err), nil, ipsetNotExist)
	}
	ks := &kernelSet{Type: ipsetType(res.TypeName), Family: res.Family, Entries: make(map[setEntry]bool, len(res.Entries))}
	if ks.Type == typeBitmapPort {
		ks.Family = 0
	}
	for _, e := range res.Entries {
		ks.Entries[fromNetlinkEntry(e).normalize(ks.Type)] = true
	}
	return ks, nil
}

func fromNetlinkEntry(e netlink.IPSetEntry) setEntry {
	var out setEntry
	if a, ok := netip.AddrFromSlice(e.IP); ok {
		out.IP = a.Unmap()
	}
	if e.Protocol != nil {
		out.Proto = *e.Protocol
	}
	if e.Port != nil {
		out.Port = *e.Port
	}
	if a, ok := netip.AddrFromSlice(e.IP2); ok {
		a = a.Unmap()
		if e.CIDR2 != 0 {
			out.Net = netip.PrefixFrom(a, int(e.CIDR2))
		} else {
			out.IP2 = a
		}
	}
	return out
}

func (n *netlinkIPSets) Create(name string, t ipsetType, family model.IPFamily) error {
	opts := netlink.IpsetCreateOptions{Family: afOf(family)}
	if t == typeBitmapPort {
		opts.PortFrom, opts.PortTo = 0, 65535
	}
	err := n.h.IpsetCreate(name, string(t), opts)
	return classify(err, []error{unix.EEXIST, nl.IPSetError(nl.IPSET_ERR_EXIST)}, nil)
}

func (n *netlinkIPSets) Destroy(name string) error {
	return classify(n.h.IpsetDestroy(name), nil, ipsetNotExist)
}

func toNetlinkEntry(t ipsetType, e setEntry) *netlink.IPSetEntry {
	out := &netlink.IPSetEntry{}
	if e.IP.IsValid() {
		out.IP = net.IP(e.IP.AsSlice())
	}
	if t != typeHashIP {
		port, proto := e.Port, e.Proto
		out.Port, out.Protocol = &port, &proto
	}
	if e.IP2.IsValid() {
		out.IP2 = net.IP(e.IP2.AsSlice())
	}
	if e.Net.IsValid() {
		out.IP2 = net.IP(e.Net.Addr().AsSlice())
		out.CIDR2 = uint8(e.Net.Bits())
	}
	return out
}

func (n *netlinkIPSets) Add(name string, t ipsetType, e setEntry) error {
	err := entryOp(nl.IPSET_CMD_ADD, n.h.IpsetAdd, name, t, e)
	return classify(err, []error{nl.IPSetError(nl.IPSET_ERR_EXIST)}, ipsetNotExist)
}

func (n *netlinkIPSets) Del(name string, t ipsetType, e setEntry) error {
	err := entryOp(nl.IPSET_CMD_DEL, n.h.IpsetDel, name, t, e)
	return classify(err, nil, []error{nl.IPSetError(nl.IPSET_ERR_EXIST), unix.ENOENT})
}

// entryOp adds or deletes (cmd, and op, the netlink handle's method doing it) one entry
// of a set of type t: through op, but for a bitmap:port set (see bitmapPortAddDel).
func entryOp(cmd int, op func(string, *netlink.IPSetEntry) error, name string, t ipsetType, e setEntry) error {
	if t == typeBitmapPort {
		return bitmapPortAddDel(cmd, name, e.Port)
	}
	return op(name, toNetlinkEntry(t, e))
}

// bitmapPortAddDel adds or deletes one port of a bitmap:port set. vishvananda/netlink sends
// a protocol attribute with every port, which bitmap:port's strict attribute policy refuses
// (IPSET_ERR_PROTOCOL, "invalid protocol"); this request carries the port alone, as
// ipset(8) sends it. It opens its own netfilter socket in the current network namespace.
func bitmapPortAddDel(cmd int, set string, port uint16) error {
	req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), nl.GetIpsetFlags(cmd)|unix.NLM_F_EXCL)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(set)))
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|int(nl.NLA_F_NET_BYTEORDER), binary.BigEndian.AppendUint16(nil, port)))
	data.AddChild(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_LINENO | nl.NLA_F_NET_BYTEORDER, Value: 0})
	req.AddData(data)
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	var errno syscall.Errno
	if errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE {
		return nl.IPSetError(uintptr(errno))
	}
	return err
}
