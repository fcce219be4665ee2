// Package dataplane defines the seam between the model and the kernel: a Backend turns a
// model.NodeState into kernel state for one IP family. Implementations live in the
// subpackages (iptables, nftables, ipvs, recording); the sync loop is their only caller.
package dataplane

import (
	"context"
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Mode names a backend as KubeProxyConfiguration.mode does.
type Mode string

const (
	ModeIPTables  Mode = "iptables"
	ModeNFTables  Mode = "nftables"
	ModeIPVS      Mode = "ipvs"
	ModeRecording Mode = "recording"
)

// Backend programs one IP family of this node.
//
// Apply is only ever called from the sync loop's single goroutine, so implementations need
// no locking of their own for state touched only by Apply.
//
// The failure rule, the same for every backend: a Service whose update the kernel rejects
// keeps its last good programming, the rules the last successful apply wrote for it (none
// if it is new). The backend never leaves it half applied (it writes a Service's change as
// a unit the kernel takes or refuses whole, or undoes the part taken) and never removes it
// for the failure; it reports it in Result.Failed and programs every other Service. The
// sync loop (pkg/syncloop) reports it (log line per attempt, sluice_services_failed,
// sluice_sync_failures_total{reason="service"}, a rate-limited Warning Event) and retries
// it on its own: syncPeriod after the failure, then after twice as long each time (up to 5
// minutes), at once when its own Service or EndpointSlices change, whatever else happens
// or not. Until then the desired state handed to Apply carries the Service's last good
// version (model.Tracker.Hold), so that a full sync keeps it too.
//
// What "last good" is after a restart, when the process has not programmed the Service
// yet: nftables and ipvs keep what the kernel held for it (nftables reads its table back;
// ipvs keeps the virtual servers it finds for the Service's addresses); iptables cannot
// tell which of the rules it finds were the Service's last good ones and leaves it out.
//
// Drift: a full resync that finds the kernel different from what the backend last wrote
// repairs it and reports the repair (Drift, sluice_drift_repairs_total).
type Backend interface {
	Mode() Mode
	Family() model.IPFamily
	// Apply makes the kernel match desired. changes says which Services differ from the
	// last successful Apply; a backend may always do more (a full sync) than asked.
	Apply(ctx context.Context, desired *model.NodeState, changes model.Changes) Result
}

// Result is what one Apply achieved.
type Result struct {
	// Err is a failure of the sync as a whole: an unknown part of desired was programmed.
	// The sync loop retries and asks for a full sync next time.
	Err error
	// Failed lists Services that could not be programmed, and why: each keeps its last
	// good programming (see Backend). Everything else in desired was programmed; the sync
	// loop reports these (Event, metric, log) and retries them on their backoff.
	Failed map[types.NamespacedName]error
	// Full reports whether this Apply rewrote everything (for the full/partial metrics).
	Full bool
}

// LocalDetectMode is KubeProxyConfiguration.detectLocalMode.
type LocalDetectMode string

const (
	DetectLocalClusterCIDR         LocalDetectMode = "ClusterCIDR"
	DetectLocalNodeCIDR            LocalDetectMode = "NodeCIDR"
	DetectLocalBridgeInterface     LocalDetectMode = "BridgeInterface"
	DetectLocalInterfaceNamePrefix LocalDetectMode = "InterfaceNamePrefix"
)

// LocalDetector says how to recognise traffic that comes from a pod on this node, for one
// family. A detector with nothing set matches nothing (the no-op detector upstream uses when
// a family has no CIDR).
type LocalDetector struct {
	Mode LocalDetectMode
	// CIDRs are the cluster CIDRs (ClusterCIDR mode) or this node's pod CIDRs (NodeCIDR
	// mode) of the detector's family.
	CIDRs []netip.Prefix
	// Interface is the pod bridge (BridgeInterface mode) or the interface name prefix
	// (InterfaceNamePrefix mode).
	Interface string
}

// IsNoOp reports whether the detector can never match.
func (d LocalDetector) IsNoOp() bool {
	switch d.Mode {
	case DetectLocalClusterCIDR, DetectLocalNodeCIDR:
		return len(d.CIDRs) == 0
	case DetectLocalBridgeInterface, DetectLocalInterfaceNamePrefix:
		return d.Interface == ""
	}
	return true
}

// NodePortAddresses is nodePortAddresses resolved for one family: the addresses NodePorts
// (and healthCheckNodePorts) answer on.
type NodePortAddresses struct {
	// MatchAll is true when NodePorts answer on every local address (nodePortAddresses unset
	// in iptables and ipvs modes, or the keyword "all").
	MatchAll bool
	// CIDRs select the local addresses when MatchAll is false. The keyword "primary" has
	// already been replaced by the node's primary IP of this family as a host prefix, and
	// "localhost" by 127.0.0.0/8 or ::1/128.
	CIDRs []netip.Prefix
}

// ContainsLoopback reports whether NodePorts answer on a loopback address.
func (n NodePortAddresses) ContainsLoopback() bool {
	if n.MatchAll {
		return true
	}
	for _, c := range n.CIDRs {
		if c.Addr().IsLoopback() || c.Contains(netip.MustParseAddr("127.0.0.1")) || c.Contains(netip.IPv6Loopback()) {
			return true
		}
	}
	return false
}

// Config is the part of the proxy configuration every backend shares, resolved for one
// family. Mode-specific settings (IPVS scheduler and timeouts, ...) are passed to each
// backend's own constructor.
type Config struct {
	Family model.IPFamily
	// NodeName is this node's name (for logs and Events).
	NodeName string
	// MasqueradeBit is the fwmark bit (0-31) that asks KUBE-POSTROUTING / masquerading to SNAT.
	MasqueradeBit int
	// MasqueradeAll masquerades all traffic to ClusterIPs.
	MasqueradeAll bool
	// LocalhostNodePorts enables NodePorts on 127.0.0.1 (iptables mode, IPv4 only).
	LocalhostNodePorts bool
	NodePortAddresses  NodePortAddresses
	LocalDetector      LocalDetector
	// SyncPeriod is how often a full resync repairs drift (syncPeriod of the active mode).
	SyncPeriod time.Duration
}
