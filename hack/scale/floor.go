package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/sluiceproxy/sluice/test/netnstest"
)

// FloorResult is the least an iptables proxy can spend on a one-endpoint change: one
// `iptables-restore --noflush` that rewrites one chain (the sentinel's Service chain,
// with the rules it has) in the table the proxy left. In the legacy flavour every restore
// copies the whole table out of the kernel and back, whatever it changes, so this is the
// cost a proxy's one-change sync is compared with.
type FloorResult struct {
	// Tool is the program run, with the flavour's multi-call binary.
	Tool  string `json:"tool"`
	Chain string `json:"chain"`
	// InputLines is the size of the restore input.
	InputLines int `json:"inputLines"`
	// Seconds are the runs' wall times (process start to exit, run from a thread in the
	// node's namespace as a proxy runs it), MedianSeconds their median.
	Seconds       []float64 `json:"seconds"`
	MedianSeconds float64   `json:"medianSeconds"`
}

// measureRestoreFloor times repeat restores of the sentinel's Service chain in the nat
// table of netns, with the mode's flavour.
// lockEnv is the node's xtables lock (xtablesLockEnv), as the proxy had it.
func measureRestoreFloor(ctx context.Context, netns, lockEnv string, r runSpec, repeat int) (*FloorResult, error) {
	multi := r.xtablesMulti()
	if multi == "" {
		return nil, fmt.Errorf("no iptables flavour in mode %s", r.Mode)
	}
	var saved bytes.Buffer
	if err := inNetns(ctx, netns, lockEnv, &saved, nil, multi, "iptables-save", "-t", "nat"); err != nil {
		return nil, err
	}
	chain, input, err := oneChainRestore(saved.String(), sentinelNamespace+"/"+sentinelName+":")
	if err != nil {
		return nil, err
	}
	f := &FloorResult{Tool: multi + " iptables-restore --noflush --counters --wait 5", Chain: chain, InputLines: strings.Count(input, "\n")}
	for range repeat {
		start := time.Now()
		if err := inNetns(ctx, netns, lockEnv, nil, strings.NewReader(input), multi, "iptables-restore", "--noflush", "--counters", "--wait", "5"); err != nil {
			return f, err
		}
		f.Seconds = append(f.Seconds, time.Since(start).Seconds())
	}
	f.MedianSeconds = median(f.Seconds)
	return f, nil
}

// oneChainRestore finds, in iptables-save output of the nat table, the Service chain that
// KUBE-SERVICES sends the Service named by the comment prefix svc ("ns/name:") to, and
// returns restore input that declares (so flushes) that chain and adds its rules again.
func oneChainRestore(saved, svc string) (chain, input string, err error) {
	lines := strings.Split(saved, "\n")
	for _, line := range lines {
		if !strings.HasPrefix(line, "-A KUBE-SERVICES ") || !strings.Contains(line, `"`+svc) {
			continue
		}
		if _, target, ok := strings.Cut(line, " -j "); ok {
			chain = strings.Fields(target)[0]
			break
		}
	}
	if chain == "" {
		return "", "", fmt.Errorf("no rule for %s in KUBE-SERVICES", svc)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n", chain)
	rules := 0
	for _, line := range lines {
		if strings.HasPrefix(line, "-A "+chain+" ") {
			b.WriteString(line + "\n")
			rules++
		}
	}
	if rules == 0 {
		return "", "", fmt.Errorf("chain %s has no rules", chain)
	}
	b.WriteString("COMMIT\n")
	return chain, b.String(), nil
}

// inNetns runs a program forked from a thread inside netns (as a proxy in that namespace
// runs its helpers: no `ip netns exec` in between).
func inNetns(ctx context.Context, netns, env string, stdout *bytes.Buffer, stdin *strings.Reader, name string, args ...string) error {
	var stderr bytes.Buffer
	return netnstest.Do(netns, func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), env)
		if stdin != nil {
			cmd.Stdin = stdin
		}
		if stdout != nil {
			cmd.Stdout = stdout
		}
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
		}
		return nil
	})
}
