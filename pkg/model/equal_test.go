package model

import (
	"net/netip"
	"reflect"
	"testing"
)

// changeField sets v (a settable field) to a non-zero value that differs from its current
// one, for the kinds ServicePort and Endpoint use.
func changeField(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Interface().(type) {
	case netip.Addr:
		v.Set(reflect.ValueOf(netip.MustParseAddr("10.9.9.9")))
		return
	case []netip.Addr:
		v.Set(reflect.ValueOf(addrs("10.9.9.9")))
		return
	case []netip.Prefix:
		v.Set(reflect.ValueOf(prefixes("10.9.0.0/16")))
		return
	case []Endpoint:
		v.Set(reflect.ValueOf([]Endpoint{{IP: netip.MustParseAddr("10.9.9.9"), Port: 9}}))
		return
	case *EndpointHints:
		v.Set(reflect.ValueOf(&EndpointHints{Zones: []string{"changed"}, Nodes: []string{"changed"}}))
		return
	case ServicePortName:
		v.Set(reflect.ValueOf(ServicePortName{NamespacedName: nn("other"), Port: "x", Protocol: UDP}))
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int32:
		v.SetInt(v.Int() + 7)
	case reflect.String:
		v.SetString(v.String() + "-changed")
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.String {
			v.Set(reflect.ValueOf([]string{"changed"}))
			return
		}
		fallthrough
	default:
		t.Fatalf("changeField does not know how to change a %s; teach it, and Equal", v.Type())
	}
}

// TestServicePortEqualCoversEveryField changes each field of ServicePort and Endpoint in
// turn and checks that Equal notices: a field added to the contract but forgotten in Equal
// would make the tracker drop real changes as no-ops.
func TestServicePortEqualCoversEveryField(t *testing.T) {
	base := func() *ServicePort {
		return &ServicePort{AllEndpoints: []Endpoint{ready(1).endpoint()}}
	}
	withHints := func() *ServicePort {
		sp := base()
		sp.AllEndpoints[0].Hints = &EndpointHints{}
		return sp
	}
	for _, kind := range []struct {
		typ  reflect.Type
		base func() *ServicePort
		// of returns the struct of this type within sp.
		of func(sp *ServicePort) reflect.Value
	}{
		{reflect.TypeFor[ServicePort](), base, func(sp *ServicePort) reflect.Value { return reflect.ValueOf(sp).Elem() }},
		{reflect.TypeFor[Endpoint](), base, func(sp *ServicePort) reflect.Value { return reflect.ValueOf(&sp.AllEndpoints[0]).Elem() }},
		{reflect.TypeFor[EndpointHints](), withHints, func(sp *ServicePort) reflect.Value { return reflect.ValueOf(sp.AllEndpoints[0].Hints).Elem() }},
	} {
		for i := range kind.typ.NumField() {
			name := kind.typ.Name() + "." + kind.typ.Field(i).Name
			t.Run(name, func(t *testing.T) {
				a, b := kind.base(), kind.base()
				changeField(t, kind.of(b).Field(i))
				if a.Equal(b) || b.Equal(a) {
					t.Errorf("Equal ignores %s", name)
				}
			})
		}
	}
}

func TestServicePortEqual(t *testing.T) {
	a := &ServicePort{AllEndpoints: []Endpoint{ready(1).endpoint()}, ClusterEndpoints: []Endpoint{ready(1).endpoint()}}
	b := &ServicePort{AllEndpoints: []Endpoint{ready(1).endpoint()}, ClusterEndpoints: []Endpoint{ready(1).endpoint()}}
	if !a.Equal(b) || !a.Equal(a) {
		t.Error("equal ports differ")
	}
	if a.Equal(nil) || (*ServicePort)(nil).Equal(a) || !(*ServicePort)(nil).Equal(nil) {
		t.Error("nil handling")
	}
	b.LocalEndpoints = []Endpoint{}
	if a.Equal(b) {
		t.Error("an unused (nil) list equals an empty used one")
	}
}
