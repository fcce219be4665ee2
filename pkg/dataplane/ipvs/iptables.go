package ipvs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/google/nftables"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Running iptables-save and iptables-restore. pkg/dataplane/iptables has its own runner and
// flavour detection but exports neither, so this is a small equivalent (same choices:
// kubelet's hint chain decides the flavour, then which flavour holds more chains, then the
// one installed as `iptables`).

// Flavour is an iptables implementation: "legacy" (x_tables) or "nft" (iptables-nft, which
// writes nf_tables rules emulating x_tables).
type Flavour string

// The two flavours.
const (
	FlavourLegacy Flavour = "legacy"
	FlavourNFT    Flavour = "nft"
)

// waitSeconds bounds the wait for the xtables lock (only the legacy flavour takes it).
const waitSeconds = 30

// iptablesRunner runs one flavour's save and restore for one family.
type iptablesRunner interface {
	// Save returns iptables-save output for the tables (all tables when none is given).
	Save(ctx context.Context, tables ...string) ([]byte, error)
	// Restore feeds input to iptables-restore --noflush.
	Restore(ctx context.Context, input []byte) error
}

// execRunner is the real iptablesRunner.
type execRunner struct {
	flavour       Flavour
	save, restore string
}

func (r *execRunner) Save(ctx context.Context, tables ...string) ([]byte, error) {
	if len(tables) == 0 {
		return r.run(ctx, r.save, nil, nil)
	}
	var all []byte
	for _, t := range tables {
		out, err := r.run(ctx, r.save, []string{"-t", t}, nil)
		if err != nil {
			return nil, err
		}
		all = append(all, out...)
	}
	return all, nil
}

func (r *execRunner) Restore(ctx context.Context, input []byte) error {
	_, err := r.run(ctx, r.restore, []string{"--noflush", "--counters", "--wait", strconv.Itoa(waitSeconds)}, input)
	return err
}

func (r *execRunner) run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errOut.String() + out.String())
		if len(msg) > 500 {
			msg = msg[:500] + "..."
		}
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.ReplaceAll(msg, "\n", "; "))
	}
	return out.Bytes(), nil
}

// toolNames returns a flavour's save and restore programs: the plain names when it is the
// flavour installed as `iptables`, the flavour's own names otherwise.
func toolNames(family model.IPFamily, flavour, installed Flavour) (save, restore string) {
	base := "iptables"
	if family == model.IPv6 {
		base = "ip6tables"
	}
	if flavour != installed {
		base += "-" + string(flavour)
	}
	return base + "-save", base + "-restore"
}

// installedFlavour asks `iptables --version` ("iptables v1.8.9 (nf_tables)").
func installedFlavour(ctx context.Context, family model.IPFamily) (Flavour, error) {
	name := "iptables"
	if family == model.IPv6 {
		name = "ip6tables"
	}
	out, err := exec.CommandContext(ctx, name, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", name, err, bytes.TrimSpace(out))
	}
	if bytes.Contains(out, []byte("nf_tables")) {
		return FlavourNFT, nil
	}
	return FlavourLegacy, nil
}

// flavourInUse reports whether a flavour has any table in this namespace, without creating
// one: legacy tables are listed in /proc, nf_tables ones are asked for over netlink.
func flavourInUse(f Flavour, family model.IPFamily) bool {
	if f == FlavourLegacy {
		name := "/proc/net/ip_tables_names"
		if family == model.IPv6 {
			name = "/proc/net/ip6_tables_names"
		}
		b, err := os.ReadFile(name)
		return err == nil && len(bytes.TrimSpace(b)) > 0
	}
	c, err := nftables.New()
	if err != nil {
		return false
	}
	tf := nftables.TableFamilyIPv4
	if family == model.IPv6 {
		tf = nftables.TableFamilyIPv6
	}
	tables, err := c.ListTablesOfFamily(tf)
	if err != nil {
		return false
	}
	for _, t := range tables {
		switch t.Name {
		case "filter", "nat", "mangle", "raw", "security":
			return true
		}
	}
	return false
}

// iptablesFlavours returns the runners of the flavours whose tools are installed, and the
// flavour to use: kubelet's KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY (mangle) decides,
// then the flavour with more chains, then the installed one.
func iptablesFlavours(ctx context.Context, family model.IPFamily) (use Flavour, runners map[Flavour]*execRunner, reason string, err error) {
	installed, err := installedFlavour(ctx, family)
	if err != nil {
		return "", nil, "", err
	}
	runners = map[Flavour]*execRunner{}
	for _, f := range []Flavour{FlavourNFT, FlavourLegacy} {
		save, restore := toolNames(family, f, installed)
		if _, err := exec.LookPath(restore); err != nil {
			continue
		}
		if _, err := exec.LookPath(save); err != nil {
			continue
		}
		runners[f] = &execRunner{flavour: f, save: save, restore: restore}
	}
	if runners[installed] == nil {
		save, restore := toolNames(family, installed, installed)
		return "", nil, "", fmt.Errorf("%s or %s not found", save, restore)
	}
	counts := map[Flavour]int{}
	for f, r := range runners {
		if !flavourInUse(f, family) {
			continue
		}
		out, err := r.Save(ctx)
		if err != nil {
			continue
		}
		if bytes.Contains(out, []byte(":KUBE-IPTABLES-HINT ")) || bytes.Contains(out, []byte(":KUBE-KUBELET-CANARY ")) {
			return f, runners, "kubelet's hint chain is in this flavour", nil
		}
		counts[f] = bytes.Count(out, []byte("\n:"))
	}
	switch {
	case counts[FlavourNFT] > counts[FlavourLegacy]:
		return FlavourNFT, runners, "it holds more chains", nil
	case counts[FlavourLegacy] > counts[FlavourNFT]:
		return FlavourLegacy, runners, "it holds more chains", nil
	}
	return installed, runners, "installed as iptables", nil
}
