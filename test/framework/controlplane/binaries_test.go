package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseScriptOutput(t *testing.T) {
	got, err := parseScriptOutput([]byte("KUBE_APISERVER=/c/bin/kube-apiserver-v1.37.2\nETCD=/c/bin/etcd-v3.7.3\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Binaries{KubeAPIServer: "/c/bin/kube-apiserver-v1.37.2", Etcd: "/c/bin/etcd-v3.7.3"}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if _, err := parseScriptOutput([]byte("KUBE_APISERVER=/x\n")); err == nil {
		t.Errorf("output without ETCD accepted")
	}
}

func writeExecutable(t *testing.T, dir, name string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFindBinariesPrefersEnvironment(t *testing.T) {
	dir := t.TempDir()
	apiserver := writeExecutable(t, dir, "kube-apiserver", 0o755)
	etcd := writeExecutable(t, dir, "etcd", 0o755)
	t.Setenv(envKubeAPIServer, apiserver)
	t.Setenv(envEtcd, etcd)
	got, err := FindBinaries(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got != (Binaries{KubeAPIServer: apiserver, Etcd: etcd}) {
		t.Errorf("got %+v", got)
	}
}

func TestBinariesCheckNamesTheVariable(t *testing.T) {
	dir := t.TempDir()
	notExecutable := writeExecutable(t, dir, "etcd", 0o644)
	err := Binaries{KubeAPIServer: filepath.Join(dir, "missing"), Etcd: notExecutable}.check()
	if err == nil {
		t.Fatal("no error for a missing and a non-executable binary")
	}
	for _, want := range []string{"KUBE_APISERVER:", "ETCD: " + notExecutable + " is not an executable"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestRepoRootFindsTheBuildScript(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, buildScript)); err != nil {
		t.Error(err)
	}
}
