package ipvs

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// vsKey identifies a virtual server the way IPVS does (for services without a firewall
// mark): protocol, address and port.
type vsKey struct {
	Proto model.Protocol
	Addr  netip.Addr
	Port  uint16
}

// String returns "10.96.0.10:53/UDP", upstream's spelling.
func (k vsKey) String() string {
	return netip.AddrPortFrom(k.Addr, k.Port).String() + "/" + string(k.Proto)
}

func compareVSKeys(a, b vsKey) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Port != b.Port {
		return int(a.Port) - int(b.Port)
	}
	switch {
	case a.Proto < b.Proto:
		return -1
	case a.Proto > b.Proto:
		return 1
	}
	return 0
}

// vsParams are a virtual server's settings that sluice chooses.
type vsParams struct {
	Scheduler string
	// Flags are IPVS service flags without flagHashed.
	Flags uint32
	// Timeout is the persistence timeout in seconds (0 unless flagPersistent).
	Timeout uint32
}

func (p vsParams) String() string {
	s := p.Scheduler
	if p.Flags&flagPersistent != 0 {
		s += " persistent " + strconv.FormatUint(uint64(p.Timeout), 10)
	}
	if f := p.Flags &^ flagPersistent; f != 0 {
		s += fmt.Sprintf(" flags %#x", f)
	}
	return s
}

// realServer is a destination of a virtual server as the kernel reports it.
type realServer struct {
	Addr   netip.AddrPort
	Weight int
	// Active and Inactive are IPVS's connection counts (established, and every other state
	// that still has an entry: SYN_RECV, FIN_WAIT, TIME_WAIT, CLOSE ...). They are exact at
	// any moment, unlike the traffic statistics.
	Active, Inactive int
}

// connections is what graceful termination waits for: every connection IPVS still tracks.
func (r realServer) connections() int { return r.Active + r.Inactive }

// setEntry is one ipset member. Which fields matter depends on the set's type:
// hash:ip (IP), hash:ip,port (IP, Proto, Port), hash:ip,port,ip (+IP2), hash:ip,port,net
// (+Net), bitmap:port (Port only; the kernel keeps no protocol).
type setEntry struct {
	IP    netip.Addr
	Proto uint8
	Port  uint16
	IP2   netip.Addr
	Net   netip.Prefix
}

// String spells the entry as `ipset list` does, e.g. "10.96.0.10,udp:53".
func (e setEntry) String() string {
	var s string
	if e.IP.IsValid() {
		s = e.IP.String()
	}
	if e.Port != 0 || e.Proto != 0 {
		p := strconv.Itoa(int(e.Port))
		if e.Proto != 0 {
			p = protoName(e.Proto) + ":" + p
		}
		if s != "" {
			s += ","
		}
		s += p
	}
	if e.IP2.IsValid() {
		s += "," + e.IP2.String()
	}
	if e.Net.IsValid() {
		s += "," + e.Net.String()
	}
	return s
}

// normalize keeps only the fields a set type stores, so that entries read back from the
// kernel compare equal to the ones sluice builds.
func (e setEntry) normalize(t ipsetType) setEntry {
	switch t {
	case typeBitmapPort:
		return setEntry{Port: e.Port}
	case typeHashIP:
		return setEntry{IP: e.IP.Unmap()}
	case typeHashIPPort:
		return setEntry{IP: e.IP.Unmap(), Proto: e.Proto, Port: e.Port}
	case typeHashIPPortIP:
		return setEntry{IP: e.IP.Unmap(), Proto: e.Proto, Port: e.Port, IP2: e.IP2.Unmap()}
	case typeHashIPPortNet:
		return setEntry{IP: e.IP.Unmap(), Proto: e.Proto, Port: e.Port, Net: e.Net.Masked()}
	}
	return e
}

func protoNumber(p model.Protocol) uint8 {
	n, _ := dataplane.ProtoNumber(p) // 0 for an unknown protocol
	return n
}

// protoFromNumber reads the 16-bit protocol field of an IPVS virtual server.
func protoFromNumber(n uint16) (model.Protocol, bool) {
	if n > math.MaxUint8 {
		return "", false
	}
	return dataplane.ProtoFromNumber(uint8(n))
}

func protoName(n uint8) string {
	if name, ok := dataplane.ProtoName(n); ok {
		return name
	}
	return strconv.Itoa(int(n))
}

// kernelSet is an ipset as the kernel holds it.
type kernelSet struct {
	Type ipsetType
	// Family is unix.AF_INET or AF_INET6 for hash types, 0 (unspecified) for bitmap:port.
	Family  uint8
	Entries map[setEntry]bool
}

// kernelView is what the backend knows the kernel holds for its family. A full sync reads
// all of it; every successful operation keeps it current, so partial syncs need only read
// the real servers of the virtual servers they touch.
type kernelView struct {
	// services are the virtual servers of this family (firewall-mark services excluded).
	services map[vsKey]vsParams
	// dests are the real servers of the virtual servers read in this sync (by key). A
	// virtual server missing here was not read, which is different from having none.
	dests map[vsKey][]realServer
	// linkExists reports whether the dummy device exists; bound are its addresses of this
	// family.
	linkExists bool
	bound      map[netip.Addr]bool
	// sets are this family's ipsets that exist, by ID.
	sets map[ipsetID]*kernelSet
}

func newKernelView() *kernelView {
	return &kernelView{
		services: map[vsKey]vsParams{},
		dests:    map[vsKey][]realServer{},
		bound:    map[netip.Addr]bool{},
		sets:     map[ipsetID]*kernelSet{},
	}
}

// sortedAddrs returns the map's keys in order.
func sortedAddrs(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

func afOf(f model.IPFamily) uint8 {
	if f == model.IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}
