// Package vm helps tests that run inside sluice's test VM (hack/ipvs-vm.sh, hack/vm/README.md),
// where the kernel is Debian's stock one with IPVS, dummy interfaces and SCTP, unlike the CI
// host's.
//
// Tests use InGuest to turn "this kernel lacks a feature" from a skip into a failure: outside
// the VM a missing feature means "run me in the VM", inside it means the VM is broken.
package vm

import (
	"os"
	"strings"
)

// CmdlineFlag is the kernel command-line word hack/ipvs-vm.sh boots the guest with.
const CmdlineFlag = "sluice.vm=1"

// ModulesList is where the guest keeps hack/vm/modules.list; its "load" lines name the modules
// loaded at boot.
const ModulesList = "/etc/sluice-vm/modules.list"

// InGuest reports whether the process runs inside the test VM, judged by the kernel command
// line, which no environment variable or namespace can fake or lose.
func InGuest() bool {
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return false
	}
	return hasFlag(string(cmdline))
}

func hasFlag(cmdline string) bool {
	for _, word := range strings.Fields(cmdline) {
		if word == CmdlineFlag {
			return true
		}
	}
	return false
}

// BootModules returns the modules the guest loads at boot, in order, parsed from the text of
// hack/vm/modules.list.
func BootModules(list string) []string {
	var mods []string
	for _, line := range strings.Split(list, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 2 && fields[0] == "load" {
			mods = append(mods, fields[1])
		}
	}
	return mods
}
