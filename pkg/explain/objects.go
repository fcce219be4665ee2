package explain

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Objects are the API objects an offline explanation is computed from.
type Objects struct {
	Services       []*v1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	Nodes          []*v1.Node
	ServiceCIDRs   []*networkingv1.ServiceCIDR
	// Skipped names the objects of other kinds found in the input ("Pod ns/name").
	Skipped []string
}

// Node returns the Node called name, or nil.
func (o *Objects) Node(name string) *v1.Node {
	for _, n := range o.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// ServiceCIDRPrefixes returns the ranges of every ServiceCIDR object.
func (o *Objects) ServiceCIDRPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, sc := range o.ServiceCIDRs {
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(strings.TrimSpace(c)); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}

// DecodeObjects reads Services, EndpointSlices, Nodes and ServiceCIDRs as `kubectl get -o
// yaml` (or -o json) prints them: single objects, a v1 List, typed lists (ServiceList ...),
// or several YAML documents separated by "---", in any mix. Objects of other kinds are
// skipped and named in Skipped.
func DecodeObjects(r io.Reader) (*Objects, error) {
	out := &Objects{}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading document %d: %w", doc, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		data, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if string(bytes.TrimSpace(data)) == "null" {
			continue // a document holding only comments
		}
		if err := out.add(data, "", fmt.Sprintf("document %d", doc)); err != nil {
			return nil, err
		}
	}
}

type typeMeta struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Items      []json.RawMessage `json:"items"`
	Metadata   struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"metadata"`
}

// appendDecoded decodes one object of type T and appends it to list.
func appendDecoded[T any](decode func(into any) error, list *[]*T) error {
	obj := new(T)
	if err := decode(obj); err != nil {
		return err
	}
	*list = append(*list, obj)
	return nil
}

// add decodes one object (or list) given as JSON. itemKind is the kind implied by a typed
// list for items that do not say theirs.
func (o *Objects) add(data []byte, itemKind, where string) error {
	var tm typeMeta
	if err := json.Unmarshal(data, &tm); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	kind := tm.Kind
	if kind == "" {
		kind = itemKind
	}
	decode := func(into any) error {
		if err := json.Unmarshal(data, into); err != nil {
			return fmt.Errorf("%s: decoding %s %s: %w", where, kind, objectName(tm), err)
		}
		return nil
	}
	switch kind {
	case "List", "ServiceList", "EndpointSliceList", "NodeList", "ServiceCIDRList":
		for i, item := range tm.Items {
			if err := o.add(item, strings.TrimSuffix(kind, "List"), fmt.Sprintf("%s, item %d", where, i)); err != nil {
				return err
			}
		}
	case "Service":
		return appendDecoded(decode, &o.Services)
	case "EndpointSlice":
		return appendDecoded(decode, &o.EndpointSlices)
	case "Node":
		return appendDecoded(decode, &o.Nodes)
	case "ServiceCIDR":
		return appendDecoded(decode, &o.ServiceCIDRs)
	case "":
		return fmt.Errorf("%s: an object without a kind", where)
	default:
		o.Skipped = append(o.Skipped, kind+" "+objectName(tm))
	}
	return nil
}

func objectName(tm typeMeta) string {
	if tm.Metadata.Namespace == "" {
		return tm.Metadata.Name
	}
	return tm.Metadata.Namespace + "/" + tm.Metadata.Name
}
