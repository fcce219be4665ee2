package explain

import (
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/test/errtest"
)

// kubectlList is what `kubectl get svc,endpointslices,nodes -o yaml` prints (trimmed).
const kubectlList = `apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: web
    namespace: demo
  spec:
    clusterIP: 10.96.0.10
    clusterIPs: [10.96.0.10]
    ports:
    - name: http
      port: 80
      protocol: TCP
      targetPort: 8080
    type: ClusterIP
- addressType: IPv4
  apiVersion: discovery.k8s.io/v1
  endpoints:
  - addresses: [10.244.1.10]
    conditions: {ready: true}
    nodeName: node-a
  kind: EndpointSlice
  metadata:
    labels:
      kubernetes.io/service-name: web
    name: web-abc12
    namespace: demo
  ports:
  - name: http
    port: 8080
    protocol: TCP
- apiVersion: v1
  kind: Node
  metadata:
    labels:
      topology.kubernetes.io/zone: zone-a
    name: node-a
  spec:
    podCIDRs: [10.244.1.0/24]
  status:
    addresses:
    - address: 172.18.0.2
      type: InternalIP
- apiVersion: v1
  kind: Pod
  metadata:
    name: web-0
    namespace: demo
kind: List
metadata:
  resourceVersion: ""
`

func TestDecodeObjects(t *testing.T) {
	tests := []struct {
		name                          string
		input                         string
		services, slices, nodes, cidr int
		skipped                       []string
		wantErr                       string
	}{
		{name: "a kubectl v1 List", input: kubectlList, services: 1, slices: 1, nodes: 1, skipped: []string{"Pod demo/web-0"}},
		{
			name:     "several documents, comments and empty documents",
			input:    "# a comment\n---\napiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\n---\n---\n# only a comment\n---\n" + kubectlList,
			services: 2, slices: 1, nodes: 1, skipped: []string{"Pod demo/web-0"},
		},
		{
			name:     "a typed list whose items carry no kind",
			input:    `{"kind":"ServiceList","apiVersion":"v1","items":[{"metadata":{"name":"a","namespace":"x"}},{"metadata":{"name":"b","namespace":"x"}}]}`,
			services: 2,
		},
		{
			name:  "ServiceCIDRs",
			input: "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec:\n  cidrs: [10.96.0.0/16, 'fd00:10:96::/112']\n",
			cidr:  1,
		},
		{name: "an object without a kind", input: "metadata: {name: a}\n", wantErr: "document 1: an object without a kind"},
		{name: "a field of the wrong type", input: "kind: Service\nmetadata: {name: a}\nspec: {ports: 7}\n", wantErr: "decoding Service a"},
		{name: "not YAML", input: "kind: [\n", wantErr: "document 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := DecodeObjects(strings.NewReader(tt.input))
			if errtest.Want(t, err, tt.wantErr) {
				return
			}
			if len(objs.Services) != tt.services || len(objs.EndpointSlices) != tt.slices || len(objs.Nodes) != tt.nodes || len(objs.ServiceCIDRs) != tt.cidr {
				t.Errorf("got %d services, %d slices, %d nodes, %d ServiceCIDRs; want %d %d %d %d", len(objs.Services), len(objs.EndpointSlices),
					len(objs.Nodes), len(objs.ServiceCIDRs), tt.services, tt.slices, tt.nodes, tt.cidr)
			}
			if strings.Join(objs.Skipped, ",") != strings.Join(tt.skipped, ",") {
				t.Errorf("skipped %v, want %v", objs.Skipped, tt.skipped)
			}
		})
	}
}

func TestDecodedObjectsKeepTheirFields(t *testing.T) {
	objs, err := DecodeObjects(strings.NewReader(kubectlList))
	if err != nil {
		t.Fatal(err)
	}
	if n := objs.Node("node-a"); n == nil || n.Labels["topology.kubernetes.io/zone"] != "zone-a" || n.Status.Addresses[0].Address != "172.18.0.2" {
		t.Errorf("node-a decoded as %+v", n)
	}
	if objs.Node("node-z") != nil {
		t.Error("Node(node-z) found a node")
	}
	if s := objs.Services[0]; s.Spec.Ports[0].TargetPort.IntValue() != 8080 || s.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("Service decoded as %+v", s.Spec)
	}
	if s := objs.EndpointSlices[0]; *s.Endpoints[0].NodeName != "node-a" || !*s.Endpoints[0].Conditions.Ready {
		t.Errorf("EndpointSlice decoded as %+v", s)
	}
	cidrs, err := DecodeObjects(strings.NewReader("kind: ServiceCIDR\nmetadata: {name: k}\nspec: {cidrs: [10.96.0.0/16, ' fd00:10:96::/112', bad]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cidrs.ServiceCIDRPrefixes(); len(got) != 2 || got[0].String() != "10.96.0.0/16" || got[1].String() != "fd00:10:96::/112" {
		t.Errorf("ServiceCIDRPrefixes() = %v", got)
	}
}
