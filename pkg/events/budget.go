package events

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// Budgets of the Warnings about Services, per node: after a burst, one Event per refill
// interval; what the bucket holds back is told in one summary Event on the Node at most
// once per summaryInterval. The per-Service limit (Reporter.interval) still applies first,
// so a Service failing on every sync counts once.
//
// Without them a storm goes to the API as fast as the client's rate limit lets it: when a
// second proxy rewrote the nftables table of a node with 10 000 Services, one sluice queued
// 979 FailedToProgramService Events within a minute, which client-side throttling then
// spread over more than three minutes, delaying the client's other requests too.
const (
	// nodeLocalBurst, nodeLocalRefill: Warnings only this node has (its kernel refused a
	// Service, its health check port was taken).
	nodeLocalBurst  = 10
	nodeLocalRefill = 30 * time.Second
	// inputBurst, inputRefill: Warnings about bad input (InvalidService), which every
	// node sees but only the elected one writes; a tenant can create bad Services at will.
	inputBurst  = 20
	inputRefill = 30 * time.Second
	// summaryInterval is how often at most a budget writes its summary.
	summaryInterval = time.Minute
	// summaryExamples is how many held-back Services a summary names.
	summaryExamples = 5
)

// ReasonServiceWarningsSuppressed (Warning, on the Node): a summary of the Warnings about
// Services that a budget held back.
const ReasonServiceWarningsSuppressed = "ServiceWarningsSuppressed"

// budget is one token bucket with the bookkeeping of what it held back. Its fields are
// guarded by the Reporter's mu.
type budget struct {
	limiter *rate.Limiter
	// what is told in the summary: which Warnings, and where to look instead.
	what, seeInstead string

	held     map[string]int // reason → Warnings held back since the last summary
	examples []string       // the first few Services held back
	// summaryDue is set while a summary is scheduled.
	summaryDue bool
}

func newBudget(burst int, refill time.Duration, what, seeInstead string) *budget {
	return &budget{
		limiter:    rate.NewLimiter(rate.Every(refill), burst),
		what:       what,
		seeInstead: seeInstead,
		held:       map[string]int{},
	}
}

// allowLocked takes a token at now. When there is none it records the Warning as held
// back and reports whether a summary must be scheduled (the first hold since the last
// summary). It assumes the Reporter's mu is held.
func (b *budget) allowLocked(now time.Time, reason, service string) (ok, scheduleSummary bool) {
	if b.limiter.AllowN(now, 1) {
		return true, false
	}
	b.held[reason]++
	if len(b.examples) < summaryExamples && !slices.Contains(b.examples, service) {
		b.examples = append(b.examples, service)
	}
	if b.summaryDue {
		return false, false
	}
	b.summaryDue = true
	return false, true
}

// takeSummaryLocked returns the summary of what was held back and resets the count; ""
// when nothing was. It assumes the Reporter's mu is held.
func (b *budget) takeSummaryLocked() string {
	b.summaryDue = false
	total := 0
	reasons := make([]string, 0, len(b.held))
	for reason, n := range b.held {
		total += n
		reasons = append(reasons, reason)
	}
	if total == 0 {
		return ""
	}
	slices.Sort(reasons)
	var counts []string
	for _, reason := range reasons {
		counts = append(counts, fmt.Sprintf("%s: %d", reason, b.held[reason]))
	}
	msg := fmt.Sprintf("%d more %s were not written as Events in the last %s (%s), among them %s. %s",
		total, b.what, summaryInterval, strings.Join(counts, ", "), strings.Join(b.examples, ", "), b.seeInstead)
	clear(b.held)
	b.examples = b.examples[:0]
	return msg
}
