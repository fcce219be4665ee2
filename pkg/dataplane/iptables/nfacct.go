package iptables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/metrics"
)

// nfacct: extended accounting objects (nfnetlink_acct) that the `-m nfacct` match counts
// packets into. Upstream exposes two of them as metrics. Many kernels, this project's test
// kernel among them, are built without CONFIG_NETFILTER_NETLINK_ACCT: then the counters
// cannot be created, the rules are written without `-m nfacct`, and the metrics are absent.

const (
	nfnlSubsysAcct = 7
	nfnlMsgAcctNew = 0
	nfnlMsgAcctGet = 1
	nfacctAttrName = 1
	nfacctAttrPkts = 2
)

// nfacctClient creates and reads nfacct counters. A seam for tests.
type nfacctClient interface {
	Ensure(name string) error
	Packets(name string) (uint64, error)
}

// netlinkNFAcct talks to nfnetlink_acct.
type netlinkNFAcct struct{}

func (netlinkNFAcct) request(msgType, flags int, name string) ([][]byte, error) {
	req := nl.NewNetlinkRequest(nfnlSubsysAcct<<8|msgType, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nfacctAttrName, nl.ZeroTerminated(name)))
	return req.Execute(unix.NETLINK_NETFILTER, 0)
}

func (n netlinkNFAcct) Ensure(name string) error {
	_, err := n.request(nfnlMsgAcctNew, unix.NLM_F_CREATE|unix.NLM_F_ACK, name)
	if err != nil && !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("creating nfacct counter %s: %w", name, err)
	}
	return nil
}

func (n netlinkNFAcct) Packets(name string) (uint64, error) {
	msgs, err := n.request(nfnlMsgAcctGet, unix.NLM_F_ACK, name)
	if err != nil {
		return 0, fmt.Errorf("reading nfacct counter %s: %w", name, err)
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type&0x7fff == nfacctAttrPkts && len(a.Value) == 8 {
				return binary.BigEndian.Uint64(a.Value), nil
			}
		}
	}
	return 0, fmt.Errorf("nfacct counter %s: no packet count in the answer", name)
}

// nfacctCollector exports the two counters as upstream's metrics.
type nfacctCollector struct {
	client             nfacctClient
	localhostNodePorts bool
}

func (c *nfacctCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- metrics.IPTablesCTStateInvalidDroppedPacketsDesc
	if c.localhostNodePorts {
		ch <- metrics.LocalhostNodePortAcceptedPacketsDesc
	}
}

func (c *nfacctCollector) Collect(ch chan<- prometheus.Metric) {
	if n, err := c.client.Packets(nfacctInvalidDropped); err == nil {
		ch <- prometheus.MustNewConstMetric(metrics.IPTablesCTStateInvalidDroppedPacketsDesc, prometheus.CounterValue, float64(n))
	}
	if !c.localhostNodePorts {
		return
	}
	if n, err := c.client.Packets(nfacctLocalhostAccept); err == nil {
		ch <- prometheus.MustNewConstMetric(metrics.LocalhostNodePortAcceptedPacketsDesc, prometheus.CounterValue, float64(n))
	}
}

var nfacctRegistered atomic.Bool

// registerNFAcct registers the collector once per process (both families share the
// counters, as upstream's do).
func registerNFAcct(c *nfacctCollector, logger klog.Logger) {
	if !nfacctRegistered.CompareAndSwap(false, true) {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			logger.Error(fmt.Errorf("%v", r), "Could not register the nfacct metrics")
		}
	}()
	metrics.MustRegisterCollector(c)
}
