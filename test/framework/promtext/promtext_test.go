package promtext

import "testing"

const scrape = `# TYPE warnings counter
warnings{kind="unknown_field",field="a"} 2
warnings{kind="unknown_field",field="b"} 1
warnings{kind="duplicate_field",field="mode"} 1
# TYPE sync_seconds histogram
sync_seconds_bucket{ip_family="IPv4",le="1"} 3
sync_seconds_bucket{ip_family="IPv4",le="+Inf"} 3
sync_seconds_sum{ip_family="IPv4"} 0.5
sync_seconds_count{ip_family="IPv4"} 3
`

func TestValue(t *testing.T) {
	f, err := Parse(scrape)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		labels    []string
		want      float64
		wantFound bool
	}{
		{name: "warnings", want: 4, wantFound: true},
		{name: "warnings", labels: []string{"kind", "unknown_field"}, want: 3, wantFound: true},
		{name: "warnings", labels: []string{"kind", "unknown_field", "field", "b"}, want: 1, wantFound: true},
		{name: "warnings", labels: []string{"kind", "other"}},
		{name: "sync_seconds", labels: []string{"ip_family", "IPv4"}, want: 3, wantFound: true},
		{name: "absent"},
	} {
		got, found := f.Value(tc.name, tc.labels...)
		if got != tc.want || found != tc.wantFound {
			t.Errorf("Value(%s, %v) = %v, %v; want %v, %v", tc.name, tc.labels, got, found, tc.want, tc.wantFound)
		}
	}
}
