package health

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// EndpointWeightHeader carries the number of local ready endpoints in every per-Service
// health response, so that a load balancer can weigh nodes by it.
const EndpointWeightHeader = "X-Load-Balancing-Endpoint-Weight"

// ServiceHealthConfig configures the per-Service health servers of one IP family.
type ServiceHealthConfig struct {
	// Family selects the listen network: tcp4 on 0.0.0.0, or tcp6 on ::, when
	// NodePortAddresses matches everything.
	Family model.IPFamily
	// NodePortAddresses of Family. When it is not match-all, the servers listen only on
	// this host's addresses inside its CIDRs (the addresses NodePorts answer on).
	NodePortAddresses dataplane.NodePortAddresses
	// ProxyHealthy reports whether the proxy's sync loops are keeping up (normally
	// (*ProxyHealthServer).IsHealthy). nil means always healthy.
	ProxyHealthy func() bool
	// OnListenError, if set, is called from SyncServices when a Service's
	// healthCheckNodePort cannot be opened (the app turns it into the Warning Event
	// FailedToStartServiceHealthcheck). Other Services are not affected, and the next
	// SyncServices tries again.
	OnListenError func(service types.NamespacedName, port int32, err error)
}

// ServiceHealthServer runs one HTTP health server per LoadBalancer Service with
// externalTrafficPolicy Local, on the Service's healthCheckNodePort. It answers 200 when
// this node has at least one ready local endpoint for the Service and the proxy is
// healthy, 503 otherwise. There is one ServiceHealthServer per IP family.
//
// SyncServices and SyncEndpoints are meant to be called by the sync loop after each
// successful sync; all methods are safe for concurrent use.
type ServiceHealthServer struct {
	cfg    ServiceHealthConfig
	logger klog.Logger
	ctx    context.Context
	listen listenFunc
	// network and addrs are where every healthCheckNodePort is opened.
	network string
	addrs   []netip.Addr

	mu       sync.RWMutex
	services map[types.NamespacedName]*serviceHealthInstance
}

// serviceHealthInstance is the open health check of one Service.
type serviceHealthInstance struct {
	port      int32
	listeners []net.Listener
	server    *http.Server
	// localEndpoints is the number of ready, not terminating, endpoints on this node.
	localEndpoints int
}

// NewServiceHealthServer returns a server with no Services. ctx provides the logger; when
// it is cancelled every health check is closed and SyncServices opens no more. When cfg.NodePortAddresses is not match-all, this host's
// interface addresses are read once, now, to choose the listen addresses (as upstream
// does).
func NewServiceHealthServer(ctx context.Context, cfg ServiceHealthConfig) *ServiceHealthServer {
	var hostAddrs []netip.Addr
	var addrErr error
	if !cfg.NodePortAddresses.MatchAll {
		hostAddrs, addrErr = hostnet.InterfaceAddrs()
	}
	return newServiceHealthServer(ctx, cfg, hostAddrs, addrErr, listenTCP)
}

// newServiceHealthServer is NewServiceHealthServer with the host's addresses (or the error
// reading them) and the listen function injected.
func newServiceHealthServer(ctx context.Context, cfg ServiceHealthConfig, hostAddrs []netip.Addr, hostAddrsErr error, listen listenFunc) *ServiceHealthServer {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "ipFamily", cfg.Family.String())
	network, addrs := listenAddresses(cfg.Family, cfg.NodePortAddresses, hostAddrs)
	if hostAddrsErr != nil {
		network, addrs = listenAddresses(cfg.Family, dataplane.NodePortAddresses{MatchAll: true}, nil)
		logger.Error(hostAddrsErr, "Cannot list this host's addresses; health check node ports will listen on all addresses")
	} else if len(addrs) == 0 {
		logger.Error(nil, "No address of this host matches nodePortAddresses; health check node ports will not be opened",
			"nodePortAddresses", cfg.NodePortAddresses.CIDRs)
	}
	s := &ServiceHealthServer{
		cfg:      cfg,
		logger:   logger,
		ctx:      ctx,
		listen:   listen,
		network:  network,
		addrs:    addrs,
		services: map[types.NamespacedName]*serviceHealthInstance{},
	}
	context.AfterFunc(ctx, s.Close)
	return s
}

// listenAddresses returns the network and addresses the health check node ports of family
// listen on: the family's wildcard address when npa matches everything, else the host's
// addresses of the family inside npa's CIDRs (sorted, without duplicates).
func listenAddresses(family model.IPFamily, npa dataplane.NodePortAddresses, hostAddrs []netip.Addr) (string, []netip.Addr) {
	network, wildcard := "tcp4", netip.IPv4Unspecified()
	if family == model.IPv6 {
		network, wildcard = "tcp6", netip.IPv6Unspecified()
	}
	if npa.MatchAll {
		return network, []netip.Addr{wildcard}
	}
	var out []netip.Addr
	for _, a := range hostAddrs {
		a = a.Unmap()
		if model.FamilyOf(a) != family {
			continue
		}
		for _, c := range npa.CIDRs {
			if c.Contains(a) {
				out = append(out, a)
				break
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return network, slices.Compact(out)
}

// SyncServices makes the open health checks match services (Service → healthCheckNodePort):
// it closes those no longer wanted or whose port changed, and opens the missing ones. A
// Service whose port cannot be opened is reported to OnListenError and left out; it is
// tried again on the next call.
func (s *ServiceHealthServer) SyncServices(services map[types.NamespacedName]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return // shut down
	}

	// Close first, so that a port handed from one Service to another is free again.
	for name, inst := range s.services {
		if port, ok := services[name]; ok && port == inst.port {
			continue
		}
		s.logger.V(2).Info("Closing health check", "service", klog.KRef(name.Namespace, name.Name), "port", inst.port)
		inst.close()
		delete(s.services, name)
	}

	// Open in a stable order, so that a port two Services ask for goes to the same one
	// every time.
	names := make([]types.NamespacedName, 0, len(services))
	for name := range services {
		if s.services[name] == nil {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, compareNames)
	for _, name := range names {
		port := services[name]
		inst, err := s.open(name, port)
		if err != nil {
			s.logger.Error(err, "Failed to open health check", "service", klog.KRef(name.Namespace, name.Name), "port", port)
			if s.cfg.OnListenError != nil {
				s.cfg.OnListenError(name, port, err)
			}
			continue
		}
		s.logger.V(2).Info("Opened health check", "service", klog.KRef(name.Namespace, name.Name), "port", port)
		s.services[name] = inst
	}
}

func compareNames(a, b types.NamespacedName) int {
	if c := cmp.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

// open listens on port at every listen address and starts serving. On failure it closes
// whatever it opened. It assumes s.mu is held.
func (s *ServiceHealthServer) open(name types.NamespacedName, port int32) (*serviceHealthInstance, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("health check node port %d is out of range", port)
	}
	inst := &serviceHealthInstance{port: port}
	for _, addr := range s.addrs {
		hostPort := net.JoinHostPort(addr.String(), strconv.Itoa(int(port)))
		l, err := s.listen(s.ctx, s.network, hostPort)
		if err != nil {
			inst.close()
			return nil, fmt.Errorf("listen on %s: %w", hostPort, err)
		}
		inst.listeners = append(inst.listeners, l)
	}
	inst.server = newHTTPServer(serviceHandler{name: name, s: s})
	for _, l := range inst.listeners {
		go func() {
			if err := inst.server.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.logger.Error(err, "Health check server stopped", "service", klog.KRef(name.Namespace, name.Name), "address", l.Addr().String())
			}
		}()
	}
	return inst, nil
}

// close stops serving and releases the ports before returning. (http.Server.Close alone
// would leave a listener open until its Serve goroutine has started.)
func (inst *serviceHealthInstance) close() {
	if inst.server != nil {
		_ = inst.server.Close()
	}
	for _, l := range inst.listeners {
		_ = l.Close()
	}
}

// SyncEndpoints records the number of ready, not terminating, local endpoints of each
// Service. Services not in counts have none; counts for Services without an open health
// check are ignored.
func (s *ServiceHealthServer) SyncEndpoints(counts map[types.NamespacedName]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, inst := range s.services {
		inst.localEndpoints = counts[name]
	}
}

// Ports returns the health checks currently open (Service → port), for diagnostics.
func (s *ServiceHealthServer) Ports() map[types.NamespacedName]int32 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[types.NamespacedName]int32, len(s.services))
	for name, inst := range s.services {
		out[name] = inst.port
	}
	return out
}

// ListenAddresses returns the addresses every health check node port is opened on.
func (s *ServiceHealthServer) ListenAddresses() []netip.Addr {
	return slices.Clone(s.addrs)
}

// Close closes every open health check.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, inst := range s.services {
		inst.close()
		delete(s.services, name)
	}
}

// ServiceHealth is the JSON body of a per-Service health response; the field names and
// the tab-indented layout are upstream kube-proxy's.
type ServiceHealth struct {
	Service             ServiceRef `json:"service"`
	LocalEndpoints      int        `json:"localEndpoints"`
	ServiceProxyHealthy bool       `json:"serviceProxyHealthy"`
}

// ServiceRef names the Service a health response is about.
type ServiceRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

type serviceHandler struct {
	name types.NamespacedName
	s    *ServiceHealthServer
}

func (h serviceHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.s.mu.RLock()
	count := 0
	if inst := h.s.services[h.name]; inst != nil {
		count = inst.localEndpoints
	}
	h.s.mu.RUnlock()
	proxyHealthy := h.s.cfg.ProxyHealthy == nil || h.s.cfg.ProxyHealthy()

	code := http.StatusServiceUnavailable
	if count > 0 && proxyHealthy {
		code = http.StatusOK
	}
	body, err := json.MarshalIndent(ServiceHealth{
		Service:             ServiceRef{Namespace: h.name.Namespace, Name: h.name.Name},
		LocalEndpoints:      count,
		ServiceProxyHealthy: proxyHealthy,
	}, "", "\t")
	if err != nil {
		body = []byte(`{}`)
	}
	setJSONHeaders(w)
	w.Header().Set(EndpointWeightHeader, strconv.Itoa(count))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
