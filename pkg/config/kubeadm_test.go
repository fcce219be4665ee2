package config

import (
	"os"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// testdata/kubeadm-kube-proxy.yaml is the config.conf key of the kube-proxy ConfigMap as
// kubeadm v1.37 writes it for podSubnet 10.244.0.0/16: every field present, most with
// their zero value (burst: 0, configSyncPeriod: 0s, maxPerCore: null, ...), and mode
// iptables set explicitly. Clusters upgraded from kube-proxy hand sluice exactly this.
const kubeadmFixture = "testdata/kubeadm-kube-proxy.yaml"

func TestKubeadmConfigMapDecodesWithoutLoss(t *testing.T) {
	data, err := os.ReadFile(kubeadmFixture)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Decode(data)
	if err != nil {
		t.Fatalf("strict decoding of kubeadm's output failed: %v", err)
	}
	again, err := Encode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(data) {
		t.Errorf("decoding and re-encoding changed the file:\n%s", again)
	}
}

func TestKubeadmConfigMapGetsUpstreamsEffectiveValues(t *testing.T) {
	o := mustComplete(t, "--config", kubeadmFixture, "--hostname-override", "node-a")
	e := o.Effective
	node := model.NodeInfo{Name: "node-a", IPs: dualStackNode.IPs}

	checks := []struct {
		what      string
		got, want any
	}{
		{"mode", e.Mode, dataplane.ModeIPTables},
		{"mode defaulted", e.ModeDefaulted, false},
		{"node name", e.NodeName, "node-a"},
		{"kubeconfig", e.ClientConnection.Kubeconfig, "/var/lib/kube-proxy/kubeconfig.conf"},
		{"content type", e.ClientConnection.ContentType, "application/vnd.kubernetes.protobuf"},
		{"qps (0 means unset)", e.ClientConnection.QPS, float32(5)},
		{"burst (0 means unset)", e.ClientConnection.Burst, int32(10)},
		{"configSyncPeriod (0s means unset)", e.ConfigSyncPeriod, 15 * time.Minute},
		{"bind address", e.BindAddress.String(), "0.0.0.0"},
		{"healthz (\"\" means unset)", e.HealthzBindAddress, "0.0.0.0:10256"},
		{"metrics", e.MetricsBindAddress, "127.0.0.1:10249"},
		{"sync period", e.SyncPeriod, 30 * time.Second},
		{"min sync period", e.MinSyncPeriod, 1 * time.Second},
		{"max sync interval", e.MaxSyncInterval, time.Hour},
		{"masquerade bit", e.MasqueradeBit, 14},
		{"masquerade all", e.MasqueradeAll, false},
		{"localhost nodeports", e.LocalhostNodePorts, true},
		{"detect-local mode", e.DetectLocalMode, dataplane.DetectLocalClusterCIDR},
		{"cluster CIDR", e.ClusterCIDRs[0].String(), "10.244.0.0/16"},
		{"conntrack maxPerCore (null means unset)", e.Conntrack.MaxPerCore, 32768},
		{"conntrack min", e.Conntrack.Min, 131072},
		{"conntrack established", e.Conntrack.TCPEstablishedTimeout, 24 * time.Hour},
		{"conntrack close-wait", e.Conntrack.TCPCloseWaitTimeout, time.Hour},
		{"oom score adj", e.OOMScoreAdj, -999},
		{"ipvs scheduler", e.IPVS.Scheduler, "rr"},
		{"logging format", o.Config.Logging.Format, "text"},
		{"logging flush (0 means unset)", o.Config.Logging.FlushFrequency.Duration.Duration, 5 * time.Second},
		{"NodePorts on all addresses (unset, iptables)", e.NodePortAddressesFor(model.IPv4, node).MatchAll, true},
		{"IPv4 local detector", e.LocalDetectorFor(model.IPv4, node).CIDRs[0].String(), "10.244.0.0/16"},
		{"IPv6 local detector is a no-op", e.LocalDetectorFor(model.IPv6, node).IsNoOp(), true},
		{"ipvs gate on", o.FeatureGates.Enabled(KubeProxyIPVS), true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
}
