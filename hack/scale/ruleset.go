package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// RulesetSize is how big the proxy's ruleset is, as the listing tool prints it.
type RulesetSize struct {
	// Tool is the command that listed it.
	Tool string `json:"tool"`
	// Bytes is the size of the listing's text.
	Bytes int `json:"bytes"`
	// Chains, Rules and Elements count chains, rules, and elements of named sets and maps
	// (nft); iptables-save has no elements.
	Chains   int `json:"chains"`
	Rules    int `json:"rules"`
	Elements int `json:"elements,omitempty"`
	// ListSeconds is how long the listing took.
	ListSeconds float64 `json:"listSeconds"`
	Error       string  `json:"error,omitempty"`
}

// listRuleset lists the ruleset of the node namespace ns the way an operator would for the
// run's mode, and measures it. With saveTo, the listing is kept in that file.
func listRuleset(ctx context.Context, ns string, r runSpec, timeout time.Duration, saveTo string) RulesetSize {
	var args []string
	switch r.Mode {
	case modeNFTables:
		args = []string{"nft", "list", "ruleset"}
	case modeIPTablesLegacy:
		args = []string{"iptables-legacy-save"}
	case modeIPTablesNFT:
		args = []string{"iptables-nft-save"}
	}
	size := RulesetSize{Tool: strings.Join(args, " ")}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	size.ListSeconds = time.Since(start).Seconds()
	if err != nil {
		if ctx.Err() != nil {
			size.Error = fmt.Sprintf("not listed within %s", timeout)
		} else {
			size.Error = fmt.Sprintf("%v: %s", err, bytes.TrimSpace(stderr.Bytes()))
		}
		return size
	}
	size.Bytes = stdout.Len()
	if saveTo != "" {
		if err := os.WriteFile(saveTo, stdout.Bytes(), 0o644); err != nil {
			size.Error = fmt.Sprintf("saving the listing: %v", err)
		}
	}
	if r.Mode == modeNFTables {
		size.Chains, size.Rules, size.Elements = countNFT(stdout.String())
	} else {
		size.Chains, size.Rules = countIPTablesSave(stdout.String())
	}
	return size
}

// countIPTablesSave counts chain declarations (":NAME ...") and rules ("-A ...").
func countIPTablesSave(text string) (chains, rules int) {
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			chains++
		case strings.HasPrefix(line, "-A "):
			rules++
		}
	}
	return chains, rules
}

// countNFT counts what `nft list ruleset` prints: chains, the rules in them (a chain's
// type/policy/comment lines are not rules) and the elements of named sets and maps (an
// elements block may span lines; its entries are separated by commas, which kube-proxy's
// elements never contain otherwise).
func countNFT(text string) (chains, rules, elements int) {
	type block int
	const (
		none block = iota
		inChain
		inSet
	)
	state := none
	inElements := false
	for _, raw := range strings.Split(text, "\n") {
		line := strings.TrimSpace(raw)
		if inElements {
			elements += strings.Count(line, ",")
			if strings.HasSuffix(line, "}") {
				elements++ // the last entry has no comma after it
				inElements = false
			}
			continue
		}
		switch {
		case line == "":
		case strings.HasPrefix(line, "chain ") && strings.HasSuffix(line, "{"):
			chains++
			state = inChain
		case (strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "map ")) && strings.HasSuffix(line, "{"):
			state = inSet
		case line == "}":
			state = none
		case state == inChain:
			if !strings.HasPrefix(line, "type ") && !strings.HasPrefix(line, "policy ") && !strings.HasPrefix(line, "comment ") {
				rules++
			}
		case state == inSet && strings.HasPrefix(line, "elements = {"):
			body := strings.TrimPrefix(line, "elements = {")
			elements += strings.Count(body, ",")
			if strings.HasSuffix(body, "}") {
				if strings.TrimSpace(strings.TrimSuffix(body, "}")) != "" {
					elements++
				}
			} else {
				inElements = true
			}
		}
	}
	return chains, rules, elements
}
