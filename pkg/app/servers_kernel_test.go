//go:build kernel

package app

// The metrics server with real sockets: this process runs in a network namespace of its
// own (the node, netnstest.Main), and a second namespace (the peer, another machine on
// the node's network) is joined to it by a veth pair: node 192.0.2.1 and fd00:db8::1,
// peer 192.0.2.2 and fd00:db8::2. Nothing here touches the root namespace.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/netnstest"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

const (
	nodeIPv4, peerIPv4 = "192.0.2.1", "192.0.2.2"
	nodeIPv6, peerIPv6 = "fd00:db8::1", "fd00:db8::2"
	metricsPort        = "10249"
)

// joinPeer creates the peer namespace and the veth pair, and returns the peer's name.
func joinPeer(t *testing.T) string {
	t.Helper()
	peer := netnstest.NewNamed(t, "slpeer")
	run := func(args ...string) { netnstest.MustRun(t, "ip", args...) }
	run("link", "add", "veth-node", "type", "veth", "peer", "name", "veth-peer")
	// Deleting the peer namespace deletes the pair; this covers a failure before that.
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "veth-node").Run() })
	run("link", "set", "veth-peer", "netns", peer)
	run("addr", "add", nodeIPv4+"/24", "dev", "veth-node")
	run("addr", "add", nodeIPv6+"/64", "dev", "veth-node", "nodad")
	run("link", "set", "veth-node", "up")
	run("-n", peer, "addr", "add", peerIPv4+"/24", "dev", "veth-peer")
	run("-n", peer, "addr", "add", peerIPv6+"/64", "dev", "veth-peer", "nodad")
	run("-n", peer, "link", "set", "veth-peer", "up")
	return peer
}

// clientIn returns an HTTP client whose connections are made in network namespace ns
// ("" for this process's own).
func clientIn(ns string) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		if ns == "" {
			return d.DialContext(ctx, network, addr)
		}
		var conn net.Conn
		err := netnstest.Do(ns, func() error {
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
	}
}

// get returns the status code and body of GET url from client, or -1 and the error.
func get(client *http.Client, url string) (int, string, http.Header) {
	resp, err := client.Get(url)
	if err != nil {
		return -1, err.Error(), nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestDebugPagesRefuseOtherNamespacesAndServeLoopback runs the metrics server with each
// kind of metricsBindAddress. From the peer, upstream's pages answer (when the address is
// reachable from there) and every debug page is refused; on the node, the debug pages
// answer over loopback, also when metricsBindAddress is one non-loopback address (the
// 127.0.0.1 twin listener that `sluice status` uses), and are refused through the node's
// own address.
func TestDebugPagesRefuseOtherNamespacesAndServeLoopback(t *testing.T) {
	peer := joinPeer(t)
	fromPeer, onNode := clientIn(peer), clientIn("")
	url := func(host, path string) string { return "http://" + net.JoinHostPort(host, metricsPort) + path }

	for _, tc := range []struct {
		bind string
		// peerHosts are node addresses the peer reaches the server at.
		peerHosts []string
		// loopbackHosts are loopback addresses the server answers on, on the node.
		loopbackHosts []string
	}{
		{bind: "0.0.0.0", peerHosts: []string{nodeIPv4}, loopbackHosts: []string{"127.0.0.1"}},
		{bind: "::", peerHosts: []string{nodeIPv4, nodeIPv6}, loopbackHosts: []string{"127.0.0.1", "::1"}},
		{bind: nodeIPv4, peerHosts: []string{nodeIPv4}, loopbackHosts: []string{"127.0.0.1"}},
		{bind: nodeIPv6, peerHosts: []string{nodeIPv6}, loopbackHosts: []string{"127.0.0.1"}},
		{bind: "127.0.0.1", loopbackHosts: []string{"127.0.0.1"}},
	} {
		t.Run("metricsBindAddress="+tc.bind, func(t *testing.T) {
			s, _, _ := testServers(t, newMapSource(), net.JoinHostPort(tc.bind, metricsPort), true)
			ctx, cancel := context.WithCancelCause(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); s.runMetrics(ctx, cancel) }()
			t.Cleanup(func() { cancel(nil); <-done })

			waitFor := func(client *http.Client, u string) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for {
					if code, _, _ := get(client, u); code > 0 {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s never answered", u)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			for _, h := range tc.loopbackHosts {
				waitFor(onNode, url(h, "/healthz"))
			}

			for _, h := range tc.peerHosts {
				code, body, hdr := get(fromPeer, url(h, "/healthz"))
				if code != http.StatusOK || body != "ok" || hdr.Get("X-Content-Type-Options") != "nosniff" {
					t.Errorf("peer GET /healthz at %s: %d %q (nosniff %q)", h, code, body, hdr.Get("X-Content-Type-Options"))
				}
				for _, path := range []string{"/metrics", "/proxyMode", "/configz"} {
					if code, body, _ := get(fromPeer, url(h, path)); code != http.StatusOK {
						t.Errorf("peer GET %s at %s: %d %.200s", path, h, code, body)
					}
				}
				for _, path := range []string{StatePath, "/debug/pprof/", "/debug/pprof/cmdline"} {
					code, body, _ := get(fromPeer, url(h, path))
					if code != http.StatusForbidden || strings.Contains(body, StatusReportSchema) {
						t.Errorf("peer GET %s at %s: %d %.200s, want 403 and no report", path, h, code, body)
					}
				}
				// The node itself through the same non-loopback address: refused too.
				if code, _, _ := get(onNode, url(h, StatePath)); code != http.StatusForbidden {
					t.Errorf("node GET %s at its own address %s: %d, want 403", StatePath, h, code)
				}
			}
			if len(tc.peerHosts) == 0 {
				// Loopback only: the peer cannot connect at all.
				if code, _, _ := get(fromPeer, url(nodeIPv4, "/metrics")); code != -1 {
					t.Errorf("peer reached a loopback-only server: %d", code)
				}
			}

			for _, h := range tc.loopbackHosts {
				code, body, _ := get(onNode, url(h, StatePath))
				if code != http.StatusOK || !strings.Contains(body, `"schema": "`+StatusReportSchema+`"`) {
					t.Errorf("loopback GET %s at %s: %d %.200s", StatePath, h, code, body)
				}
				if code, _, _ := get(onNode, url(h, "/debug/pprof/")); code != http.StatusOK {
					t.Errorf("loopback GET /debug/pprof/ at %s: %d", h, code)
				}
			}
		})
	}
}

// TestSlowClientsAreCut: a client that sends its request headers slower than the read
// timeouts allow is disconnected, so it cannot hold a connection open at will.
func TestSlowClientsAreCut(t *testing.T) {
	s, _, _ := testServers(t, newMapSource(), net.JoinHostPort("127.0.0.1", metricsPort), false)
	ctx, cancel := context.WithCancelCause(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.runMetrics(ctx, cancel) }()
	t.Cleanup(func() { cancel(nil); <-done })

	var conn net.Conn
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if conn, err = net.Dial("tcp", "127.0.0.1:"+metricsPort); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer conn.Close()
	if _, err := fmt.Fprint(conn, "GET "+StatePath+" HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	// Never finish the headers; the server must close the connection within its header
	// timeout (plus slack for a loaded machine).
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(serverReadHeaderTimeout + 10*time.Second))
	_, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("the server kept a half-sent request open: %v", err)
	}
	if elapsed := time.Since(start); elapsed < serverReadHeaderTimeout/2 {
		t.Errorf("closed after %v, before the header timeout %v", elapsed, serverReadHeaderTimeout)
	}
}
