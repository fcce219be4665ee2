package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// Kind is the kind of the configuration object, with apiVersion v1alpha1.SchemeGroupVersion.
const Kind = "KubeProxyConfiguration"

// scheme knows only kubeproxy.config.k8s.io/v1alpha1, the one version upstream ships. No
// defaulting functions are registered: SetDefaults is called explicitly, so decoding never
// changes a value behind the caller's back.
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme, serializer.EnableStrict)
	// lenientCodecs decode as upstream's fallback does: unknown fields are dropped and the
	// last of duplicated keys wins.
	lenientCodecs = serializer.NewCodecFactory(scheme, serializer.DisableStrict)
)

func init() {
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(fmt.Sprintf("registering %s: %v", v1alpha1.SchemeGroupVersion, err))
	}
}

// DecodeError is a configuration that could not be decoded. Each problem names the field
// it is about as a path into the object (for example `unknown field "iptables.syncPerod"`
// or `conntrack.maxPerCore: invalid value "many": ...`).
type DecodeError struct {
	// Source is the file name, or "" for bytes that did not come from a file.
	Source string
	// Problems are all the problems found, in document order where it is known.
	Problems []string
}

// Error lists every problem on one line.
func (e *DecodeError) Error() string {
	what := "KubeProxyConfiguration"
	if e.Source != "" {
		what = e.Source
	}
	return fmt.Sprintf("decoding %s: %s", what, strings.Join(e.Problems, "; "))
}

// LoadFile reads and strictly decodes a KubeProxyConfiguration file (YAML or JSON): see
// Decode. It does not apply defaults: call SetDefaults (and, once flags are merged,
// ApplyPlatformDefaults). The daemon loads its file with LoadFileLenient; LoadFile is for
// tools and tests that must refuse what upstream would only warn about.
func LoadFile(path string) (*v1alpha1.KubeProxyConfiguration, error) {
	data, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := Decode(data)
	return cfg, withSource(err, path)
}

// LoadFileLenient reads and decodes a KubeProxyConfiguration file as upstream kube-proxy
// does: see DecodeLenient.
func LoadFileLenient(path string) (*v1alpha1.KubeProxyConfiguration, []FieldWarning, error) {
	data, err := readConfigFile(path)
	if err != nil {
		return nil, nil, err
	}
	cfg, warnings, err := DecodeLenient(data)
	return cfg, warnings, withSource(err, path)
}

func readConfigFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading configuration: %w", err)
	}
	return data, nil
}

// withSource names the file in a *DecodeError.
func withSource(err error, path string) error {
	var decodeErr *DecodeError
	if errors.As(err, &decodeErr) {
		decodeErr.Source = path
	}
	return err
}

// Decode strictly decodes a kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration from
// YAML or JSON. A wrong apiVersion or kind, an unknown or duplicated field, or a value of
// the wrong type is an error (*DecodeError) naming every such field by its path. This is
// the gate of `sluice config check`; the daemon uses DecodeLenient, which starts where
// upstream starts.
func Decode(data []byte) (*v1alpha1.KubeProxyConfiguration, error) {
	cfg, warnings, err := DecodeLenient(data)
	if err != nil {
		return nil, err
	}
	if len(warnings) > 0 {
		problems := make([]string, len(warnings))
		for i, w := range warnings {
			problems[i] = w.String()
		}
		return nil, &DecodeError{Problems: problems}
	}
	return cfg, nil
}

// DecodeLenient decodes a KubeProxyConfiguration as upstream kube-proxy v1.37 does
// (cmd/kube-proxy/app loadConfig): strictly first, and when only strictness failed (unknown
// or duplicated fields, nothing else), again leniently. The lenient decode ignores unknown
// fields and takes the last value of a duplicated one; each such field is returned as a
// FieldWarning, in document order, for the caller to report. Anything else stays an error
// (*DecodeError, every problem with its path): a wrong apiVersion or kind, a value of the
// wrong type, a document that is not a YAML or JSON object. Values that validation refuses
// are not looked at here.
func DecodeLenient(data []byte) (*v1alpha1.KubeProxyConfiguration, []FieldWarning, error) {
	jsonData, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, nil, &DecodeError{Problems: []string{fmt.Sprintf("not valid YAML or JSON: %v", err)}}
	}
	if problems := checkTypeMeta(jsonData); len(problems) > 0 {
		return nil, nil, &DecodeError{Problems: problems}
	}

	obj, _, decodeErr := codecs.UniversalDeserializer().Decode(data, nil, nil)
	if decodeErr == nil {
		cfg, err := asConfiguration(obj)
		return cfg, nil, err
	}

	configType := reflect.TypeFor[v1alpha1.KubeProxyConfiguration]()
	warnings := findFieldWarnings(data, configType)
	strictErr, strict := runtime.AsStrictDecodingError(decodeErr)
	if strict {
		if len(warnings) == 0 {
			// Not expected: the walk finds what the strict decoder finds. Keep the
			// decoder's own words rather than lose the warnings.
			for _, e := range strictErr.Errors() {
				warnings = append(warnings, FieldWarning{Kind: UnknownField, Path: strings.Join(strings.Fields(e.Error()), " ")})
			}
		}
		obj, _, lenientErr := lenientCodecs.UniversalDeserializer().Decode(data, nil, nil)
		if lenientErr == nil {
			cfg, err := asConfiguration(obj)
			return cfg, warnings, err
		}
		// As upstream: the lenient decode failed too, so the file is refused.
	}

	// Collect everything wrong, not just what the decoder stopped at: every unknown and
	// duplicated field, and every value of the wrong type (the decoder reports only the
	// first, and for types with their own UnmarshalJSON without saying which field).
	var problems []string
	for _, w := range warnings {
		problems = append(problems, w.String())
	}
	problems = append(problems, findValueErrors(jsonData, configType)...)
	if len(problems) == 0 {
		problems = []string{decodeErr.Error()}
	}
	return nil, nil, &DecodeError{Problems: problems}
}

func asConfiguration(obj runtime.Object) (*v1alpha1.KubeProxyConfiguration, error) {
	cfg, ok := obj.(*v1alpha1.KubeProxyConfiguration)
	if !ok {
		return nil, &DecodeError{Problems: []string{fmt.Sprintf("decoded an unexpected type %T", obj)}}
	}
	return cfg, nil
}

// checkTypeMeta reports a missing or wrong apiVersion or kind with the values expected, a
// clearer message than the scheme's "no kind is registered".
func checkTypeMeta(jsonData []byte) []string {
	var meta struct {
		APIVersion *string `json:"apiVersion"`
		Kind       *string `json:"kind"`
	}
	if err := json.Unmarshal(jsonData, &meta); err != nil {
		return []string{"the document must be a YAML or JSON object (a map of fields)"}
	}
	var problems []string
	want := v1alpha1.SchemeGroupVersion.String()
	switch {
	case meta.APIVersion == nil:
		problems = append(problems, fmt.Sprintf("apiVersion: missing, must be %q", want))
	case *meta.APIVersion != want:
		problems = append(problems, fmt.Sprintf("apiVersion: unsupported value %q, must be %q", *meta.APIVersion, want))
	}
	switch {
	case meta.Kind == nil:
		problems = append(problems, fmt.Sprintf("kind: missing, must be %q", Kind))
	case *meta.Kind != Kind:
		problems = append(problems, fmt.Sprintf("kind: unsupported value %q, must be %q", *meta.Kind, Kind))
	}
	return problems
}

// findValueErrors walks the JSON document alongside the Go type it decodes into and
// reports every value that the type rejects, with its path. The decoder itself only
// reports the first such value, and for types with their own UnmarshalJSON (durations,
// quantities) without saying which field it was. Unknown fields are skipped: see
// findFieldWarnings.
func findValueErrors(jsonData []byte, t reflect.Type) []string {
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil
	}
	var w valueWalker
	w.walk(doc, t, nil)
	return w.problems
}

var jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()

type valueWalker struct {
	problems []string
}

func (w *valueWalker) walk(value any, t reflect.Type, path *field.Path) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if value == nil {
		return // null leaves the Go value at its zero value
	}
	custom := reflect.PointerTo(t).Implements(jsonUnmarshalerType)
	switch {
	case !custom && t.Kind() == reflect.Struct:
		if object, ok := value.(map[string]any); ok {
			fields := jsonFields(t)
			for _, key := range sortedKeys(object) {
				if ft, known := fields[key]; known {
					w.walk(object[key], ft, path.Child(key))
				}
			}
			return
		}
	case !custom && t.Kind() == reflect.Map:
		if object, ok := value.(map[string]any); ok {
			for _, key := range sortedKeys(object) {
				w.walk(object[key], t.Elem(), path.Key(key))
			}
			return
		}
	case !custom && t.Kind() == reflect.Slice:
		if list, ok := value.([]any); ok {
			for i, item := range list {
				w.walk(item, t.Elem(), path.Index(i))
			}
			return
		}
	}
	raw, err := json.Marshal(value)
	if err != nil {
		return
	}
	if err := json.Unmarshal(raw, reflect.New(t).Interface()); err != nil {
		w.problems = append(w.problems, fmt.Sprintf("%s: invalid value %s: %s", path, raw, describeValueError(err, t)))
	}
}

var (
	durationType          = reflect.TypeFor[metav1.Duration]()
	loggingDurationType   = reflect.TypeFor[logsapi.TimeOrMetaDuration]()
	durationExpectedValue = `a duration such as "30s" or "1m30s"`
)

// describeValueError turns encoding/json's wording ("cannot unmarshal string into Go value
// of type int32") into a short statement about what was expected.
func describeValueError(err error, t reflect.Type) string {
	var typeErr *json.UnmarshalTypeError
	switch {
	case t == durationType || t == loggingDurationType:
		return fmt.Sprintf("expected %s (%v)", durationExpectedValue, err)
	case errors.As(err, &typeErr):
		expected := t
		if reflect.PointerTo(t).Implements(jsonUnmarshalerType) && typeErr.Type != nil {
			// The type's own UnmarshalJSON decoded into something simpler; say what.
			expected = typeErr.Type
		}
		return fmt.Sprintf("expected %s, got %s", jsonTypeName(expected), typeErr.Value)
	}
	return err.Error()
}

// jsonTypeName says what JSON/YAML value a Go type takes, in user terms.
func jsonTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer (" + t.Kind().String() + ")"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

// jsonFields maps the JSON names of a struct's fields (embedded structs flattened, as
// encoding/json does) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				fields[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	return fields
}

func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}

// Encode renders cfg as kubeproxy.config.k8s.io/v1alpha1 YAML (apiVersion and kind set),
// the format --write-config-to writes and Decode reads back.
func Encode(cfg *v1alpha1.KubeProxyConfiguration) ([]byte, error) {
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeYAML)
	if !ok {
		return nil, fmt.Errorf("no YAML serializer for %s", v1alpha1.SchemeGroupVersion)
	}
	encoder := codecs.EncoderForVersion(info.Serializer, schema.GroupVersions{v1alpha1.SchemeGroupVersion})
	var buf bytes.Buffer
	if err := encoder.Encode(cfg.DeepCopy(), &buf); err != nil {
		return nil, fmt.Errorf("encoding configuration: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteFile writes cfg to path as v1alpha1 YAML (see Encode), replacing the file.
func WriteFile(path string, cfg *v1alpha1.KubeProxyConfiguration) error {
	data, err := Encode(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing configuration: %w", err)
	}
	return nil
}
