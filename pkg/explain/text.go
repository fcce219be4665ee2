package explain

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// WriteText renders the explanation for people: one labelled line per step, then the
// endpoints (+ candidate, - excluded) with the reason for each.
func (e *Explanation) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Packet %s -> %s/%s on node %s (%s, %s mode)\n\n", e.Source, e.Destination, e.Protocol, e.Node, e.Family, e.Mode)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "Source:\t%s: %s\n", e.SourceClass.Kind, e.SourceClass.Reason)
	if e.Match == nil {
		fmt.Fprintf(tw, "Service:\tnone\n")
	} else {
		fmt.Fprintf(tw, "Service:\t%s (%s), matched by %s\n", e.Match.String(), e.Match.Type, e.Match.Reason)
		for _, o := range e.OtherMatches {
			fmt.Fprintf(tw, "\talso claimed by %s, by %s\n", o.String(), o.Reason)
		}
	}
	if e.SourceRange != nil {
		verdict := "denied"
		if e.SourceRange.Allowed {
			verdict = "allowed"
		}
		fmt.Fprintf(tw, "Source ranges:\t%s: %s\n", verdict, e.SourceRange.Reason)
	}
	if e.Policy != nil {
		fmt.Fprintf(tw, "Policy:\t%s %s -> %s endpoints: %s\n", e.Policy.Field, e.Policy.Configured, e.Policy.Applied, e.Policy.Reason)
	}
	if e.Match != nil {
		if e.AffinityTimeoutSeconds > 0 {
			fmt.Fprintf(tw, "Affinity:\tClientIP, %ds\n", e.AffinityTimeoutSeconds)
		} else {
			fmt.Fprintf(tw, "Affinity:\tnone\n")
		}
	}
	if e.Masquerade != nil {
		yes := "no"
		if e.Masquerade.Masquerade {
			yes = "yes"
		}
		fmt.Fprintf(tw, "Masquerade:\t%s: %s\n", yes, e.Masquerade.Reason)
	}
	fmt.Fprintf(tw, "Verdict:\t%s\n", e.Verdict.Summary)
	if err := tw.Flush(); err != nil {
		return err
	}
	if e.Selection != nil {
		b.WriteString("\n")
		writeSelection(&b, e.Selection, "")
	}
	if len(e.Notes) > 0 {
		b.WriteString("\nNotes:\n")
		for _, n := range e.Notes {
			fmt.Fprintf(&b, "  - %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteText renders the Service's explanation for people.
func (se *ServiceExplanation) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Service %s/%s on node %s (%s, %s mode)\n", se.Namespace, se.Name, se.Node, se.Family, se.Mode)
	for i := range se.Ports {
		p := &se.Ports[i]
		sp := &p.Port
		name := fmt.Sprintf("%d/%s", sp.Port, sp.Protocol)
		if sp.PortName != "" {
			name = fmt.Sprintf("%s (%d/%s)", sp.PortName, sp.Port, sp.Protocol)
		}
		fmt.Fprintf(&b, "\nPort %s, type %s\n", name, sp.Type)
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  Addresses:\t%s\n", addressesOf(sp))
		policies := fmt.Sprintf("internalTrafficPolicy %s, externalTrafficPolicy %s", sp.InternalTrafficPolicy, sp.ExternalTrafficPolicy)
		if sp.HealthCheckNodePort != 0 {
			policies += fmt.Sprintf(", healthCheckNodePort %d", sp.HealthCheckNodePort)
		}
		fmt.Fprintf(tw, "  Policies:\t%s\n", policies)
		if len(sp.LoadBalancerSourceRanges) > 0 {
			fmt.Fprintf(tw, "  Source ranges:\t%s (LoadBalancer IPs only)\n", strings.Join(sp.LoadBalancerSourceRanges, ", "))
		}
		if sp.AffinityTimeoutSeconds > 0 {
			fmt.Fprintf(tw, "  Affinity:\tClientIP, %ds\n", sp.AffinityTimeoutSeconds)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for j := range p.Selections {
			writeSelection(&b, &p.Selections[j], "  ")
		}
		b.WriteString("  Traffic:\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, t := range p.Traffic {
			fmt.Fprintf(tw, "    from %s\t%s\t(%s endpoints)\n", t.From, t.Verdict.Summary, t.Policy)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(se.Problems) > 0 {
		b.WriteString("\nProblems in the API objects (the rest is programmed):\n")
		for _, p := range se.Problems {
			fmt.Fprintf(&b, "  - %s %s: %s\n", p.Object, p.Field, p.Message)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSelection renders one endpoint list with a line per endpoint.
func writeSelection(b *strings.Builder, s *Selection, indent string) {
	n := len(s.Candidates())
	fmt.Fprintf(b, "%s%s endpoints: %d of %d", indent, s.Policy, n, len(s.Decisions))
	if s.Fallback && n > 0 {
		b.WriteString(", serving+terminating fallback (none ready)")
	}
	b.WriteString("\n")
	if s.TopologyDetail != "" {
		fmt.Fprintf(b, "%s  topology: %s\n", indent, s.TopologyDetail)
	}
	if len(s.Decisions) == 0 {
		fmt.Fprintf(b, "%s  (the Service has no endpoints)\n", indent)
		return
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, d := range s.Decisions {
		mark := "-"
		if d.Candidate {
			mark = "+"
		}
		ep := &d.Endpoint
		where := ep.NodeName
		if where == "" {
			where = "(no node)"
		}
		if ep.Zone != "" {
			where += "/" + ep.Zone
		}
		fmt.Fprintf(tw, "%s  %s %s\t%s\t%s\t%s\n", indent, mark, addrPort(ep), where, conditions(ep), d.Detail)
	}
	_ = tw.Flush()
}

// conditions renders an endpoint's conditions in a few words.
func conditions(ep *model.EndpointView) string {
	switch {
	case ep.Terminating && ep.Serving:
		return "terminating,serving"
	case ep.Terminating:
		return "terminating"
	case ep.Ready:
		return "ready"
	case ep.Serving:
		return "not-ready,serving"
	}
	return "not-ready"
}

func addressesOf(sp *model.ServicePortView) string {
	parts := []string{}
	if sp.ClusterIP != "" {
		parts = append(parts, fmt.Sprintf("ClusterIP %s port %d", sp.ClusterIP, sp.Port))
	}
	if sp.NodePort != 0 {
		parts = append(parts, fmt.Sprintf("NodePort %d", sp.NodePort))
	}
	if len(sp.ExternalIPs) > 0 {
		parts = append(parts, "externalIPs "+strings.Join(sp.ExternalIPs, ", "))
	}
	if len(sp.LoadBalancerVIPs) > 0 {
		parts = append(parts, "LoadBalancer IPs "+strings.Join(sp.LoadBalancerVIPs, ", "))
	}
	return strings.Join(parts, "; ")
}
