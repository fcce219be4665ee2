package explain

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

var update = flag.Bool("update", false, "rewrite the files in testdata from the current output")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./pkg/explain -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output (go test ./pkg/explain -update rewrites it); got:\n%s", path, got)
	}
}

func netipAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// goldenState is a Service with every kind of endpoint, beside the plain web Service.
func goldenState(t *testing.T) (svc, svc) {
	s := lbLocal
	s.affinity = true
	s.ranges = []string{"203.0.113.0/24"}
	s.eps = append(append([]ep{}, s.eps...), servingTerminating("10.244.1.12", "node-a"), notReady("10.244.2.12", "node-b"),
		terminatingGone("10.244.2.13", "node-b"))
	return s, web
}

func TestTextAndJSONRenderings(t *testing.T) {
	lb, plain := goldenState(t)
	state := stateOf(t, lb, plain)
	nft := defaultConfig()
	nft.Mode = dataplane.ModeNFTables

	packets := []struct {
		golden string
		cfg    Config
		packet Packet
	}{
		{"packet-lb-external.txt", defaultConfig(), pkt(externalClient, "192.0.2.11:80")},
		{"packet-lb-pod.txt", defaultConfig(), pkt(podA0, "192.0.2.11:80")},
		{"packet-source-range.txt", nft, pkt(netipAddr("198.51.100.1"), "192.0.2.11:80")},
		{"packet-no-match.txt", nft, pkt(podA0, "10.96.0.10:443")},
	}
	for _, p := range packets {
		t.Run(p.golden, func(t *testing.T) {
			e := Explain(state, p.cfg, p.packet)
			var b bytes.Buffer
			if err := e.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			golden(t, p.golden, b.Bytes())
		})
	}
	t.Run("service-text", func(t *testing.T) {
		se, ok := ExplainService(state, defaultConfig(), "demo", "lb-local")
		if !ok {
			t.Fatal("lb-local not found")
		}
		var b bytes.Buffer
		if err := se.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		golden(t, "service-lb-local.txt", b.Bytes())
	})
	t.Run("packet-json", func(t *testing.T) {
		e := Explain(state, defaultConfig(), pkt(externalClient, "192.0.2.11:80"))
		out, err := json.MarshalIndent(e, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "packet-lb-external.json", append(out, '\n'))
	})
	t.Run("unknown service", func(t *testing.T) {
		if _, ok := ExplainService(state, defaultConfig(), "demo", "nope"); ok {
			t.Error("ExplainService found a Service that does not exist")
		}
	})
}
