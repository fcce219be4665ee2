package config

import (
	"fmt"
	"reflect"

	yamlv3 "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// FieldWarningKind says what is wrong with a field that a lenient decode ignores. The
// values are the `kind` label of the sluice_config_warnings metric.
type FieldWarningKind string

const (
	// UnknownField is a field the configuration type does not have (a typo, a field of
	// another version or component): upstream's lenient decode ignores it.
	UnknownField FieldWarningKind = "unknown_field"
	// DuplicateField is a key given more than once in the same object: upstream's lenient
	// decode keeps the last value.
	DuplicateField FieldWarningKind = "duplicate_field"
)

// FieldWarningKinds lists every kind, for metrics that must show each from the start.
var FieldWarningKinds = []FieldWarningKind{UnknownField, DuplicateField}

// FieldWarning is one field that only a lenient decode accepts: strict decoding (`sluice
// config check`) refuses it, the daemon starts and reports it.
type FieldWarning struct {
	Kind FieldWarningKind
	// Path is the field's v1alpha1 path: "iptables.syncPerod", "featureGates[Foo]",
	// "ipvs.excludeCIDRs[0]".
	Path string
}

// String says what was found and what the lenient decode does with it.
func (w FieldWarning) String() string {
	switch w.Kind {
	case DuplicateField:
		return fmt.Sprintf("duplicate field %q (the last value is used)", w.Path)
	default:
		return fmt.Sprintf("unknown field %q (ignored)", w.Path)
	}
}

// findFieldWarnings walks the YAML (or JSON, which is YAML) document alongside the Go type
// it decodes into and returns, in document order, every key the type does not have and
// every key repeated within one object, by path. The JSON and YAML decoders report
// duplicates with a line number at best; the walk gives the path. A document that does not
// parse here gives no warnings (the decoders then report it).
func findFieldWarnings(data []byte, t reflect.Type) []FieldWarning {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil
	}
	w := fieldWalker{seen: map[FieldWarning]bool{}}
	w.walk(doc.Content[0], t, nil)
	return w.warnings
}

type fieldWalker struct {
	warnings []FieldWarning
	seen     map[FieldWarning]bool
}

func (w *fieldWalker) add(kind FieldWarningKind, path *field.Path) {
	fw := FieldWarning{Kind: kind, Path: path.String()}
	if !w.seen[fw] {
		w.seen[fw] = true
		w.warnings = append(w.warnings, fw)
	}
}

func (w *fieldWalker) walk(node *yamlv3.Node, t reflect.Type, path *field.Path) {
	for node.Kind == yamlv3.AliasNode && node.Alias != nil {
		node = node.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	// Types with their own decoding (durations, quantities) are leaves: what is inside
	// is their business, and a wrong value there is a value error.
	if reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		return
	}
	switch node.Kind {
	case yamlv3.MappingNode:
		var fields map[string]reflect.Type
		switch t.Kind() {
		case reflect.Struct:
			fields = jsonFields(t)
		case reflect.Map:
		default:
			return // a value of the wrong type: a value error, not a field warning
		}
		keys := map[string]bool{}
		for i := 0; i+1 < len(node.Content); i += 2 {
			keyNode, value := node.Content[i], node.Content[i+1]
			if keyNode.Kind != yamlv3.ScalarNode || keyNode.Tag == "!!merge" {
				continue
			}
			key := keyNode.Value
			var childPath *field.Path
			var childType reflect.Type
			if fields != nil {
				childPath = path.Child(key)
				ft, known := fields[key]
				if !known {
					w.add(UnknownField, childPath)
					continue
				}
				childType = ft
			} else {
				childPath = path.Key(key)
				childType = t.Elem()
			}
			if keys[key] {
				w.add(DuplicateField, childPath)
			}
			keys[key] = true
			w.walk(value, childType, childPath)
		}
	case yamlv3.SequenceNode:
		if t.Kind() != reflect.Slice {
			return
		}
		for i, item := range node.Content {
			w.walk(item, t.Elem(), path.Index(i))
		}
	}
}
