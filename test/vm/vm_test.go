package vm

import (
	"os"
	"slices"
	"testing"
)

func TestHasFlagMatchesWholeWordsOnly(t *testing.T) {
	tests := []struct {
		cmdline string
		want    bool
	}{
		{"console=ttyS0 panic=-1 quiet sluice.vm=1", true},
		{"sluice.vm=1\n", true},
		{"console=ttyS0 sluice.vm=10", false},
		{"console=ttyS0 xsluice.vm=1", false},
		{"", false},
	}
	for _, tc := range tests {
		if got := hasFlag(tc.cmdline); got != tc.want {
			t.Errorf("hasFlag(%q) = %v, want %v", tc.cmdline, got, tc.want)
		}
	}
}

func TestBootModulesReadsLoadLinesInOrder(t *testing.T) {
	list := "# comment\ninclude net/netfilter\nload crc32c_generic\n  load libcrc32c  # after crc32c\n\nload ip_vs\nloader x\n"
	want := []string{"crc32c_generic", "libcrc32c", "ip_vs"}
	if got := BootModules(list); !slices.Equal(got, want) {
		t.Errorf("BootModules = %q, want %q", got, want)
	}
}

func TestBootModulesOfTheRealListPutChecksumsFirst(t *testing.T) {
	// libcrc32c needs the crc32c algorithm registered when it loads (see modules.list).
	path := "../../hack/vm/modules.list"
	if InGuest() {
		path = ModulesList // the guest has no source tree, only the copy /init reads
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	mods := BootModules(string(data))
	generic, lib, ipvs := slices.Index(mods, "crc32c_generic"), slices.Index(mods, "libcrc32c"), slices.Index(mods, "ip_vs")
	if generic < 0 || lib < 0 || ipvs < 0 || generic > lib || lib > ipvs {
		t.Errorf("modules.list loads crc32c_generic at %d, libcrc32c at %d, ip_vs at %d; want that order", generic, lib, ipvs)
	}
}
