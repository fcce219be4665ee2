//go:build e2e

package rollout

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/echoserver/echo"
)

// countedProbes is how many connections TestTrafficCountersAll makes per family.
const countedProbes = 4

// With --traffic-counters=all (a flag, not part of KubeProxyConfiguration, rolled out
// node by node), sluice counts the traffic of every Service without the annotation, and
// not of one annotated sluice.dev/traffic-counters: "false". Each connection from the
// client pod to the ClusterIP counts once on path cluster, with at least its SYN and
// ACK as packets and their headers as bytes. (test/conformance's TrafficCounters covers
// the annotation, NodePorts, partial syncs and sluice explain.)
func TestTrafficCountersAllCountsEveryService(t *testing.T) {
	env := NewEnv(t)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			node := env.RegisterNode(t, nodeName("counters-all", mode), NodeOptions{PodCIDRs: true})
			s := env.StartSluice(t, SluiceOptions{Node: node, Config: env.Config(t, node, mode, nil), Args: []string{"--traffic-counters=all"}})
			s.WaitSynced(t)

			svc := env.EchoService(t, node)
			optOut := env.EchoService(t, node)
			optOut.Annotations = map[string]string{model.AnnotationTrafficCounters: "false"}
			if _, err := env.Kube.CoreV1().Services(optOut.Namespace).Update(t.Context(), optOut, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("annotating %s/%s: %v", optOut.Namespace, optOut.Name, err)
			}
			env.ExpectServed(t, s, svc)
			env.ExpectServed(t, s, optOut)

			labels := []string{"namespace", svc.Namespace, "service", svc.Name, "path", "cluster"}
			for _, fam := range env.Families {
				target := netip.AddrPortFrom(clusterIP(t, svc, fam), servicePort)
				before := countersOf(t, s, labels)
				for range countedProbes {
					if out := env.Client.Probe(echo.TCP, target, echo.ProbeOptions{}); out.Result != echo.Answered {
						t.Fatalf("%s -> %s: %s", env.Client.Name, target, out)
					}
				}
				after := countersOf(t, s, labels)
				header := 40.0 // IPv4 and TCP headers, at least
				if fam == corev1.IPv6Protocol {
					header = 60
				}
				if got := after[0] - before[0]; got != countedProbes {
					t.Errorf("%s: sluice_service_new_connections_total%v +%v after %d connections, want +%d", fam, labels, got, countedProbes, countedProbes)
				}
				if got, want := after[1]-before[1], float64(2*countedProbes); got < want {
					t.Errorf("%s: sluice_service_packets_total%v +%v, want at least +%v (a SYN and an ACK per connection)", fam, labels, got, want)
				}
				if got, want := after[2]-before[2], 2*countedProbes*header; got < want {
					t.Errorf("%s: sluice_service_bytes_total%v +%v, want at least +%v", fam, labels, got, want)
				}
			}
			for _, m := range []string{"sluice_service_new_connections_total", "sluice_service_packets_total", "sluice_service_bytes_total"} {
				if v, found, err := s.Metric(m, "namespace", optOut.Namespace); err != nil || found {
					t.Errorf("%s of the Service annotated %q: %v (found %v, err %v), want no series", m, "false", v, found, err)
				}
			}
		})
	}
}

// countersOf reads the new connections, packets and bytes of the series with labels; a
// metric without such a series fails t.
func countersOf(t *testing.T, s *Sluice, labels []string) [3]float64 {
	t.Helper()
	var out [3]float64
	for i, m := range []string{"sluice_service_new_connections_total", "sluice_service_packets_total", "sluice_service_bytes_total"} {
		v, found, err := s.Metric(m, labels...)
		if err != nil || !found {
			t.Fatalf("%s%v: found %v, err %v\n%s", m, labels, found, err, s.Proc.Tail(20))
		}
		out[i] = v
	}
	return out
}
