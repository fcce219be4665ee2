package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// Binaries are the programs a control plane runs.
type Binaries struct {
	// KubeAPIServer is the path of a kube-apiserver binary.
	KubeAPIServer string
	// Etcd is the path of an etcd binary.
	Etcd string
}

// Environment variables that name the binaries, as printed by hack/control-plane.sh --env.
const (
	envKubeAPIServer = "KUBE_APISERVER"
	envEtcd          = "ETCD"
)

// buildScript is the script that builds and caches the binaries, relative to the
// repository root.
const buildScript = "hack/control-plane.sh"

var (
	scriptMu      sync.Mutex
	scriptResults Binaries // the script's answer, once it succeeded in this process
)

// FindBinaries returns the kube-apiserver and etcd to run. The environment variables
// KUBE_APISERVER and ETCD win; whatever they leave unset comes from
// hack/control-plane.sh --env, which builds the binaries first if they are not cached
// (about 9 minutes the first time on 2 cores, then instant). The script's progress goes
// to this process's stderr.
func FindBinaries(ctx context.Context) (Binaries, error) {
	b := Binaries{KubeAPIServer: os.Getenv(envKubeAPIServer), Etcd: os.Getenv(envEtcd)}
	if b.KubeAPIServer == "" || b.Etcd == "" {
		fromScript, err := binariesFromScript(ctx)
		if err != nil {
			return Binaries{}, err
		}
		if b.KubeAPIServer == "" {
			b.KubeAPIServer = fromScript.KubeAPIServer
		}
		if b.Etcd == "" {
			b.Etcd = fromScript.Etcd
		}
	}
	if err := b.check(); err != nil {
		return Binaries{}, err
	}
	return b, nil
}

// check reports a missing or non-executable binary with the variable that names it.
func (b Binaries) check() error {
	var errs []error
	for _, bin := range []struct{ env, path string }{{envKubeAPIServer, b.KubeAPIServer}, {envEtcd, b.Etcd}} {
		info, err := os.Stat(bin.path)
		switch {
		case bin.path == "":
			errs = append(errs, fmt.Errorf("%s: no binary given", bin.env))
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", bin.env, err))
		case info.IsDir() || info.Mode()&0o111 == 0:
			errs = append(errs, fmt.Errorf("%s: %s is not an executable file", bin.env, bin.path))
		}
	}
	return errors.Join(errs...)
}

// binariesFromScript runs the build script once per process; concurrent callers wait for
// the first (the script itself serialises builds across processes with flock).
func binariesFromScript(ctx context.Context) (Binaries, error) {
	scriptMu.Lock()
	defer scriptMu.Unlock()
	if scriptResults != (Binaries{}) {
		return scriptResults, nil
	}
	root, err := repoRoot()
	if err != nil {
		return Binaries{}, err
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, buildScript), "--env")
	cmd.Dir = root
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return Binaries{}, fmt.Errorf("%s --env (set %s and %s to skip it): %w", buildScript, envKubeAPIServer, envEtcd, err)
	}
	b, err := parseScriptOutput(stdout.Bytes())
	if err != nil {
		return Binaries{}, fmt.Errorf("%s --env: %w", buildScript, err)
	}
	scriptResults = b
	return b, nil
}

// parseScriptOutput reads the KEY=VALUE lines of hack/control-plane.sh --env.
func parseScriptOutput(out []byte) (Binaries, error) {
	var b Binaries
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok {
			continue
		}
		switch key {
		case envKubeAPIServer:
			b.KubeAPIServer = value
		case envEtcd:
			b.Etcd = value
		}
	}
	if b.KubeAPIServer == "" || b.Etcd == "" {
		return Binaries{}, fmt.Errorf("output %q lacks %s= or %s=", out, envKubeAPIServer, envEtcd)
	}
	return b, nil
}

// repoRoot finds the repository holding the build script: upwards from the working
// directory (go test runs in the package's directory), else from this source file.
func repoRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if _, err := os.Stat(filepath.Join(dir, buildScript)); err == nil {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("cannot find %s above %v: set %s and %s", buildScript, starts, envKubeAPIServer, envEtcd)
}
