package require

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how Feature ended the test instead of ending it.
type recorder struct {
	testing.TB
	ended string // "skip: ..." or "fail: ..."; empty when Feature returned
}

// stop unwinds Feature like Skip and Fatal unwind a test.
type stop struct{}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.ended = "skip: " + fmt.Sprintf(format, args...)
	panic(stop{})
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.ended = "fail: " + fmt.Sprintf(format, args...)
	panic(stop{})
}
func (r *recorder) Fatal(args ...any) {
	r.ended = "fail: " + fmt.Sprint(args...)
	panic(stop{})
}

func feature(t *testing.T, feature string, have bool) string {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if v := recover(); v != nil {
				if _, ok := v.(stop); !ok {
					panic(v)
				}
			}
		}()
		Feature(r, feature, have, "kernel has no SCTP sockets")
	}()
	return r.ended
}

func TestFeature(t *testing.T) {
	for _, tt := range []struct {
		name, env, feature string
		have               bool
		want               string // prefix of how the test ended; "" = it went on
	}{
		{name: "present, not required", feature: SCTP, have: true},
		{name: "present and required", env: "sctp,ipvs", feature: SCTP, have: true},
		{name: "absent, not required: skip", env: "ipvs", feature: SCTP, want: `skip: kernel has no SCTP sockets (feature "sctp"; SLUICE_REQUIRE=sctp would make this a failure)`},
		{name: "absent, nothing required: skip", feature: SCTP, want: "skip: "},
		{name: "absent and required: fail", env: "ipvs, sctp", feature: SCTP, want: `fail: kernel has no SCTP sockets: SLUICE_REQUIRE requires "sctp" here`},
		{name: "unknown name in the list fails even when present", env: "sctp,scpt", feature: SCTP, have: true, want: `fail: SLUICE_REQUIRE="sctp,scpt": unknown feature "scpt"`},
		{name: "unknown feature asked for", feature: "frobnicator", have: true, want: `fail: require.Feature: unknown feature "frobnicator"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(Env, tt.env)
			got := feature(t, tt.feature, tt.have)
			if (tt.want == "") != (got == "") || !strings.HasPrefix(got, tt.want) {
				t.Errorf("Feature ended the test with %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEveryKnownFeatureParses(t *testing.T) {
	got, err := parse(strings.Join(Known, ","))
	if err != nil || len(got) != len(Known) {
		t.Errorf("parse(every known name) = %v, %v", got, err)
	}
}
