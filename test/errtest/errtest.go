// Package errtest checks the error a row of a table-driven test asks for, so that the rows
// with a wantErr field share one check instead of each test writing it again.
package errtest

import (
	"strings"
	"testing"
)

// Want fails the test (t.Fatalf) unless err is the error a row asks for: with want "", no
// error; otherwise an error whose text contains want. It returns whether the row wanted an
// error, in which case there is no result to check and the row stops there:
//
//	got, err := parse(tt.in)
//	if errtest.Want(t, err, tt.wantErr) {
//		return
//	}
//	// check got
func Want(t testing.TB, err error, want string) (wantedError bool) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return false
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want one containing %q", err, want)
	}
	return true
}
