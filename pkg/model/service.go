package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Labels and annotations the model reads.
const (
	// LabelServiceProxyName marks a Service as handled by another proxy. kube-proxy's
	// informer excludes Services that carry it (whatever its value); so does the model.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// AnnotationIPVSScheduler asks the IPVS backend for a scheduler for one Service.
	AnnotationIPVSScheduler = "ipvs.sluice.dev/scheduler"
	// AnnotationTrafficCounters asks the backends to count one Service's traffic
	// ("true" or "false", as strconv.ParseBool spells them). Options.TrafficCounters
	// decides what a Service without it gets.
	AnnotationTrafficCounters = "sluice.dev/traffic-counters"
)

// TrafficCounters is the node-wide choice of which Services' traffic is counted.
type TrafficCounters string

// The values of TrafficCounters. The zero value is TrafficCountersAnnotated.
const (
	// TrafficCountersAnnotated counts the Services annotated sluice.dev/traffic-counters: "true".
	TrafficCountersAnnotated TrafficCounters = "annotated"
	// TrafficCountersAll counts every Service but those annotated "false".
	TrafficCountersAll TrafficCounters = "all"
	// TrafficCountersOff counts nothing, whatever the annotations say.
	TrafficCountersOff TrafficCounters = "off"
)

// ParseTrafficCounters reads the value of the --traffic-counters flag ("" is annotated).
func ParseTrafficCounters(s string) (TrafficCounters, error) {
	switch v := TrafficCounters(s); v {
	case "", TrafficCountersAnnotated:
		return TrafficCountersAnnotated, nil
	case TrafficCountersAll, TrafficCountersOff:
		return v, nil
	}
	return "", fmt.Errorf("traffic counters %q: want one of all, annotated, off", s)
}

// ipvsSchedulers are the schedulers of the Linux IPVS code (ip_vs_*.c), as ipvsadm spells
// them.
var ipvsSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

// ValidIPVSScheduler reports whether name is a Linux IPVS scheduler (rr, wrr, lc, wlc, lblc,
// lblcr, dh, sh, sed, nq, mh, fo, ovf, twos): the values AnnotationIPVSScheduler accepts.
func ValidIPVSScheduler(name string) bool { return slices.Contains(ipvsSchedulers, name) }

// Session affinity limits of the Service API (defaulting and validation).
const (
	defaultAffinityTimeoutSeconds = v1.DefaultClientIPServiceAffinitySeconds
	maxAffinityTimeoutSeconds     = 86400
)

// Options is the configuration that changes what the model computes.
type Options struct {
	// IgnoreExternalIPs drops spec.externalIPs, as upstream does when the
	// AllowServiceExternalIPs feature gate is off. The zero value matches the gate's
	// default (on), so a forgotten option cannot silently unprogram externalIPs.
	IgnoreExternalIPs bool
	// Families are the IP families Compute and the Tracker build a NodeState for, in
	// order; nil means Families (both).
	Families []IPFamily
	// TrafficCounters decides which Service ports are Counted; the zero value counts
	// only Services annotated sluice.dev/traffic-counters: "true".
	TrafficCounters TrafficCounters
}

// families returns the families to compute, defaulted.
func (o Options) families() []IPFamily {
	if len(o.Families) == 0 {
		return Families
	}
	return o.Families
}

// ComputeService returns what this node must program for one Service in one IP family,
// and the problems found in its objects. slices are the Service's EndpointSlices (those
// labelled kubernetes.io/service-name=<name> in its namespace), of any family and in any
// order; the others are ignored.
//
// It returns no ports for a Service the proxy never programs (ExternalName, headless, or
// labelled service.kubernetes.io/service-proxy-name) and for one without a ClusterIP of
// this family. Bad input never stops the rest: an invalid IP, port or endpoint is left out
// and reported as a Problem, and everything else is computed as usual.
//
// ComputeService is pure and safe for concurrent use; it never modifies its arguments, and
// the ServicePorts it returns share no memory that a caller could later change (they may
// share strings with the API objects, which are immutable).
func ComputeService(svc *v1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo, family IPFamily, opts Options) ([]*ServicePort, []Problem) {
	if svc == nil || skipService(svc) {
		return nil, nil
	}
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	problems := &problemList{service: name}
	clusterIP, ok := clusterIPOf(svc, family, problems)
	if !ok {
		return nil, problems.result()
	}

	base := serviceBase(svc, family, opts, problems)
	base.ClusterIP = clusterIP
	endpoints := getScratch()
	defer endpoints.release()
	endpoints.parseSlices(name, slices, family, node, problems)

	ports := make([]*ServicePort, 0, len(svc.Spec.Ports))
	seen := newPortSet(len(svc.Spec.Ports))
	for i := range svc.Spec.Ports {
		spec := &svc.Spec.Ports[i]
		field := path{"spec.ports", i}
		protocol, ok := parseProtocol(string(spec.Protocol))
		if !ok {
			problems.add("Service", field.at(".protocol"), "unknown protocol %s; port ignored", quote(string(spec.Protocol)))
			continue
		}
		if !validPort(spec.Port) {
			problems.add("Service", field.at(".port"), "%d is not a valid port; port ignored", spec.Port)
			continue
		}
		if !seen.addName(spec.Name, protocol) {
			problems.add("Service", field.at(".name"), "another port is named %s for %s; port ignored", quote(spec.Name), protocol)
			continue
		}
		if !seen.addPort(spec.Port, protocol) {
			problems.add("Service", field.at(".port"), "port %d/%s is listed twice; port ignored", spec.Port, protocol)
			continue
		}

		sp := new(ServicePort)
		*sp = base
		sp.Name = ServicePortName{NamespacedName: name, Port: spec.Name, Protocol: protocol}
		sp.Port = spec.Port
		sp.NodePort = nodePortOf(spec, base.Type, protocol, field, &seen, problems)
		sp.AllEndpoints = endpoints.forPort(spec.Name, protocol)
		selectEndpoints(sp, node)
		ports = append(ports, sp)
		seen.accepted = ports
	}
	return ports, problems.result()
}

// skipService reports whether the proxy never programs svc, in any family.
func skipService(svc *v1.Service) bool {
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return true
	}
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return true
	}
	if svc.Spec.ClusterIP == v1.ClusterIPNone || slices.Contains(svc.Spec.ClusterIPs, v1.ClusterIPNone) {
		return true // headless
	}
	return svc.Spec.ClusterIP == "" && len(svc.Spec.ClusterIPs) == 0
}

// clusterIPOf returns the Service's ClusterIP of family. It reads spec.clusterIPs (or
// spec.clusterIP for objects written before dual-stack) and goes by each address's own
// family rather than trusting spec.ipFamilies to line up with it.
func clusterIPOf(svc *v1.Service, family IPFamily, problems *problemList) (netip.Addr, bool) {
	field, ips := "spec.clusterIPs", svc.Spec.ClusterIPs
	if len(ips) == 0 {
		field, ips = "spec.clusterIP", []string{svc.Spec.ClusterIP}
	}
	var found netip.Addr
	for i, s := range ips {
		if s == "" {
			continue
		}
		addr, err := parseIP(s)
		if err != nil {
			problems.add("Service", fmt.Sprintf("%s[%d]", field, i), "%v; no ClusterIP in this family", err)
			continue
		}
		if FamilyOf(addr) != family {
			continue
		}
		if found.IsValid() {
			problems.add("Service", fmt.Sprintf("%s[%d]", field, i), "second %s ClusterIP %s ignored", family, addr)
			continue
		}
		found = addr
	}
	return found, found.IsValid()
}

// serviceBase returns the fields every port of svc shares in family (ClusterIP excepted).
func serviceBase(svc *v1.Service, family IPFamily, opts Options, problems *problemList) ServicePort {
	var sp ServicePort
	switch svc.Spec.Type {
	case "", v1.ServiceTypeClusterIP:
		sp.Type = TypeClusterIP
	case v1.ServiceTypeNodePort:
		sp.Type = TypeNodePort
	case v1.ServiceTypeLoadBalancer:
		sp.Type = TypeLoadBalancer
	default:
		problems.add("Service", "spec.type", "unknown type %s; treated as ClusterIP", quote(string(svc.Spec.Type)))
		sp.Type = TypeClusterIP
	}

	if !opts.IgnoreExternalIPs {
		sp.ExternalIPs = externalIPsOf(svc, family, problems)
	}
	sp.LoadBalancerVIPs = loadBalancerVIPsOf(svc, family, problems)
	sp.LoadBalancerSourceRanges = sourceRangesOf(svc, family, problems)
	sp.AffinityTimeoutSeconds = affinityTimeoutOf(svc, problems)

	// Upstream's apiservice.ExternallyAccessible looks at the Service as a whole (its type
	// and its raw externalIPs), not at what this family ended up with.
	externallyAccessible := sp.Type != TypeClusterIP || len(svc.Spec.ExternalIPs) > 0
	switch svc.Spec.ExternalTrafficPolicy {
	case "", v1.ServiceExternalTrafficPolicyCluster:
	case v1.ServiceExternalTrafficPolicyLocal:
		sp.ExternalPolicyLocal = externallyAccessible
	default:
		problems.add("Service", "spec.externalTrafficPolicy", "unknown policy %s; treated as Cluster", quote(string(svc.Spec.ExternalTrafficPolicy)))
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		switch *p {
		case v1.ServiceInternalTrafficPolicyCluster:
		case v1.ServiceInternalTrafficPolicyLocal:
			sp.InternalPolicyLocal = true
		default:
			problems.add("Service", "spec.internalTrafficPolicy", "unknown policy %s; treated as Cluster", quote(string(*p)))
		}
	}

	if sp.Type == TypeLoadBalancer && sp.ExternalPolicyLocal {
		switch p := svc.Spec.HealthCheckNodePort; {
		case p == 0:
			problems.add("Service", "spec.healthCheckNodePort", "LoadBalancer Service with externalTrafficPolicy Local has no healthCheckNodePort")
		case !validPort(p):
			problems.add("Service", "spec.healthCheckNodePort", "%d is not a valid port; ignored", p)
		default:
			sp.HealthCheckNodePort = p
		}
	}

	if v, ok := svc.Annotations[AnnotationIPVSScheduler]; ok {
		if ValidIPVSScheduler(v) {
			sp.Scheduler = v
		} else {
			problems.add("Service", "metadata.annotations["+AnnotationIPVSScheduler+"]",
				"unknown IPVS scheduler %s (want one of %s); the default scheduler is used", quote(v), strings.Join(ipvsSchedulers, ", "))
		}
	}
	sp.Counted = trafficCounted(svc, opts.TrafficCounters, problems)
	return sp
}

// trafficCounted says whether a Service's traffic is counted: the annotation decides
// when it parses, the node-wide choice otherwise. A malformed annotation is a problem
// and counts as absent; with the node-wide choice off nothing is counted, so that an
// operator can turn every counter off at once.
func trafficCounted(svc *v1.Service, mode TrafficCounters, problems *problemList) bool {
	v, ok := svc.Annotations[AnnotationTrafficCounters]
	var on bool
	if ok {
		var err error
		if on, err = strconv.ParseBool(strings.TrimSpace(v)); err != nil {
			problems.add("Service", "metadata.annotations["+AnnotationTrafficCounters+"]",
				"%s is not true or false; the node's default (%s) is used", quote(v), cmp.Or(string(mode), string(TrafficCountersAnnotated)))
			ok = false
		}
	}
	switch mode {
	case TrafficCountersOff:
		return false
	case TrafficCountersAll:
		return !ok || on
	default:
		return ok && on
	}
}

// externalIPsOf returns spec.externalIPs of family, sorted and without duplicates. Empty
// strings are skipped without a problem, as upstream does (clients write them often).
func externalIPsOf(svc *v1.Service, family IPFamily, problems *problemList) []netip.Addr {
	var out []netip.Addr
	for i, s := range svc.Spec.ExternalIPs {
		if strings.TrimSpace(s) == "" {
			continue
		}
		out = appendAddr(out, s, path{"spec.externalIPs", i}.at(""), family, problems)
	}
	return sortedAddrs(out)
}

// loadBalancerVIPsOf returns the ingress IPs of family that the proxy must capture: those
// whose ipMode is unset or VIP. Hostname-only entries and ipMode Proxy ones (the load
// balancer delivers to the node, not to the VIP) are left out.
func loadBalancerVIPsOf(svc *v1.Service, family IPFamily, problems *problemList) []netip.Addr {
	var out []netip.Addr
	for i := range svc.Status.LoadBalancer.Ingress {
		ing := &svc.Status.LoadBalancer.Ingress[i]
		if ing.IP == "" {
			continue
		}
		field := path{"status.loadBalancer.ingress", i}
		if ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP {
			if *ing.IPMode != v1.LoadBalancerIPModeProxy {
				problems.add("Service", field.at(".ipMode"), "unknown ipMode %s; IP ignored", quote(string(*ing.IPMode)))
			}
			continue
		}
		out = appendAddr(out, ing.IP, field.at(".ip"), family, problems)
	}
	return sortedAddrs(out)
}

// appendAddr appends the address s to out when it is of family. A bad address is a
// problem of the Service at field, and ignored.
func appendAddr(out []netip.Addr, s, field string, family IPFamily, problems *problemList) []netip.Addr {
	addr, err := parseIP(s)
	if err != nil {
		problems.add("Service", field, "%v; ignored", err)
		return out
	}
	if FamilyOf(addr) == family {
		out = append(out, addr)
	}
	return out
}

// sourceRangesOf returns spec.loadBalancerSourceRanges of family, trimmed, parsed, sorted
// and without duplicates. A range covering the whole family means no filtering, which is
// what an empty list says.
func sourceRangesOf(svc *v1.Service, family IPFamily, problems *problemList) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		if strings.TrimSpace(s) == "" {
			continue
		}
		prefix, err := parsePrefix(s)
		if err != nil {
			problems.add("Service", fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), "%v; ignored", err)
			continue
		}
		if FamilyOf(prefix.Addr()) != family {
			continue
		}
		if prefix.Bits() == 0 {
			return nil
		}
		out = append(out, prefix)
	}
	if len(out) == 0 {
		return nil
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Bits(), b.Bits())
	})
	return slices.Compact(out)
}

// affinityTimeoutOf returns the ClientIP affinity timeout, 0 without affinity.
func affinityTimeoutOf(svc *v1.Service, problems *problemList) int32 {
	switch svc.Spec.SessionAffinity {
	case "", v1.ServiceAffinityNone:
		return 0
	case v1.ServiceAffinityClientIP:
	default:
		problems.add("Service", "spec.sessionAffinity", "unknown session affinity %s; treated as None", quote(string(svc.Spec.SessionAffinity)))
		return 0
	}
	cfg := svc.Spec.SessionAffinityConfig
	if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
		return defaultAffinityTimeoutSeconds // what API defaulting would have set
	}
	t := *cfg.ClientIP.TimeoutSeconds
	if t <= 0 || t > maxAffinityTimeoutSeconds {
		problems.add("Service", "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
			"%d is outside 1-%d; the default %d is used", t, maxAffinityTimeoutSeconds, defaultAffinityTimeoutSeconds)
		return defaultAffinityTimeoutSeconds
	}
	return t
}

// nodePortOf returns the port's validated NodePort, 0 when it has none or an invalid one.
func nodePortOf(spec *v1.ServicePort, typ ServiceType, protocol Protocol, field path, seen *portSet, problems *problemList) int32 {
	p := spec.NodePort
	switch {
	case p == 0:
		return 0
	case typ == TypeClusterIP:
		problems.add("Service", field.at(".nodePort"), "a ClusterIP Service has no NodePorts; %d ignored", p)
		return 0
	case !validPort(p):
		problems.add("Service", field.at(".nodePort"), "%d is not a valid port; ignored", p)
		return 0
	case !seen.addNodePort(p, protocol):
		problems.add("Service", field.at(".nodePort"), "NodePort %d/%s is listed twice; ignored", p, protocol)
		return 0
	}
	return p
}

// parseProtocol maps a Service or EndpointSlice protocol; "" is TCP, the API default.
func parseProtocol(s string) (Protocol, bool) {
	switch Protocol(s) {
	case "", TCP:
		return TCP, true
	case UDP, SCTP:
		return Protocol(s), true
	}
	return "", false
}

// sortedAddrs sorts addrs and removes duplicates; nil when empty.
func sortedAddrs(addrs []netip.Addr) []netip.Addr {
	if len(addrs) == 0 {
		return nil
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}

// portSet finds duplicate ports of one Service. Services have few ports, so it scans the
// ports accepted so far; a map takes over for the rare Service with many.
type portSet struct {
	accepted []*ServicePort
	big      map[portKey]struct{}
}

// portKey is one kind of uniqueness: a name, a port or a NodePort, per protocol.
type portKey struct {
	kind     byte
	name     string
	port     int32
	protocol Protocol
}

func newPortSet(n int) portSet {
	if n > 16 {
		return portSet{big: make(map[portKey]struct{}, 3*n)}
	}
	return portSet{}
}

// add records k and reports whether it is new; match finds k among the accepted ports.
func (s *portSet) add(k portKey, match func(*ServicePort) bool) bool {
	if s.big == nil {
		return !slices.ContainsFunc(s.accepted, match)
	}
	if _, dup := s.big[k]; dup {
		return false
	}
	s.big[k] = struct{}{}
	return true
}

func (s *portSet) addName(name string, p Protocol) bool {
	return s.add(portKey{kind: 'n', name: name, protocol: p}, func(o *ServicePort) bool {
		return o.Name.Port == name && o.Name.Protocol == p
	})
}

func (s *portSet) addPort(port int32, p Protocol) bool {
	return s.add(portKey{kind: 'p', port: port, protocol: p}, func(o *ServicePort) bool {
		return o.Port == port && o.Name.Protocol == p
	})
}

func (s *portSet) addNodePort(port int32, p Protocol) bool {
	return s.add(portKey{kind: 'N', port: port, protocol: p}, func(o *ServicePort) bool {
		return o.NodePort == port && o.Name.Protocol == p
	})
}
