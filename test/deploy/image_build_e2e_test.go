//go:build e2e

package deploy

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestImageBuildIsStaticAndStampsTheVersion runs the Dockerfile's go build, with exactly its
// environment and flags, and checks the binary the image would get: static (the runtime
// image has no Go toolchain and the binary must not depend on its libc), and reporting the
// version it was stamped with. It is in the e2e tier because it compiles sluice (seconds with
// `make build`'s warm cache, minutes cold).
func TestImageBuildIsStaticAndStampsTheVersion(t *testing.T) {
	const version = "v0.0.0-deploy-test"
	b := dockerGoBuild(t, version)
	out := filepath.Join(t.TempDir(), "sluice")
	args := make([]string, len(b.args))
	copy(args, b.args)
	for i, a := range args {
		if a == b.output {
			args[i] = out
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), b.env...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
	}

	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary has a %v program header: it is dynamically linked", p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	if f.Section(".symtab") != nil {
		t.Error("the binary has a symbol table; -ldflags -s should strip it")
	}

	for _, argv := range [][]string{{"version"}, {"--version"}} {
		got, err := exec.Command(out, argv...).CombinedOutput()
		if err != nil {
			t.Fatalf("sluice %s: %v\n%s", argv[0], err, got)
		}
		if want := "sluice " + version; strings.TrimSpace(string(got)) != want {
			t.Errorf("sluice %s printed %q, want %q", argv[0], got, want)
		}
	}

	// The image links kube-proxy's path to sluice; run through such a link.
	link := filepath.Join(filepath.Dir(out), "kube-proxy")
	if err := os.Symlink("sluice", link); err != nil {
		t.Fatal(err)
	}
	if got, err := exec.Command(link, "version").CombinedOutput(); err != nil || !strings.Contains(string(got), version) {
		t.Errorf("sluice run as kube-proxy: %v: %s", err, got)
	}
}
