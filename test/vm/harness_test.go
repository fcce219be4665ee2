//go:build vmharness

// Host-side tests of hack/ipvs-vm.sh itself: that the guest's exit status comes back, that
// --file and --share reach the guest, and that the hard timeout holds. Each test boots the VM
// (seconds to tens of seconds under TCG), so they run only when asked for:
//
//	go test -tags vmharness ./test/vm/
package vm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runHarness runs hack/ipvs-vm.sh with args and returns its exit status and combined output.
func runHarness(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("../../hack/ipvs-vm.sh", args...)
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exitErr):
		return exitErr.ExitCode(), string(out)
	default:
		t.Fatalf("running hack/ipvs-vm.sh: %v\n%s", err, out)
		return 0, ""
	}
}

func TestHarnessExitsWithTheGuestCommandsStatus(t *testing.T) {
	status, out := runHarness(t, "--timeout", "600", "--", "sh", "-c", "echo SLUICE-VM-EXIT-STATUS=0; exit 7")
	if status != 7 {
		t.Fatalf("exit status %d, want 7 (the guest command's, not the faked marker's):\n%s", status, out)
	}
}

func TestHarnessCarriesFilesAndSharesIntoTheGuest(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "copied"), []byte("copied in"), 0o644); err != nil {
		t.Fatal(err)
	}
	share := filepath.Join(dir, "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "shared"), []byte("shared over 9p"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `set -e
test "$(cat /opt/in/copied)" = "copied in"
test "$(cat /mnt/share/shared)" = "shared over 9p"
if touch /mnt/share/written 2>/dev/null; then echo "read-only share is writable"; exit 1; fi
echo guest-saw-everything`
	status, out := runHarness(t, "--timeout", "600",
		"--file", filepath.Join(dir, "copied")+":/opt/in/copied",
		"--share", share+":/mnt/share",
		"--", "bash", "-c", script)
	if status != 0 || !strings.Contains(out, "guest-saw-everything") {
		t.Fatalf("exit status %d:\n%s", status, out)
	}
}

func TestHarnessStopsAHungGuestAtTheTimeout(t *testing.T) {
	status, out := runHarness(t, "--timeout", "40", "--", "sleep", "3600")
	if status != 124 {
		t.Fatalf("exit status %d, want 124 (timeout):\n%s", status, out)
	}
}
