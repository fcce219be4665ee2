// Package isolate finds the items a kernel refuses in a batch it takes or refuses whole
// (an iptables-restore input, an nf_tables transaction), so that everything else is
// committed: the blame-and-bisect loop of the backends. Each item is one Service's change
// (or another unit of failure); a batch is committed by the caller's Try.
//
// When the kernel refuses a batch and its answer names the items at fault, those are
// blamed and the rest of the batch is tried again. When it names nobody, the batch is
// split in halves, each tried on its own (the first before the second), until the culprit
// is alone. Every batch taken stays taken: the search never undoes progress, and it costs
// O(k log n) attempts for k culprits among n items.
package isolate

import (
	"errors"
	"fmt"
)

// Outcome is what the kernel said to one batch.
type Outcome struct {
	// Err is nil when the kernel took the batch.
	Err error
	// Blamed are the items the kernel's answer names, by their position in the batch,
	// each with its error. Empty: the answer names nobody.
	Blamed map[int]error
	// Stop ends the search with Err: the failure is not about the items (a lock held too
	// long, an answer lost), or only the caller can answer it.
	Stop bool
}

// Taken is the Outcome of a batch the kernel took.
var Taken = Outcome{}

// Search commits batches of items.
type Search[T any] struct {
	// Try commits one batch (never empty).
	Try func(batch []T) Outcome
	// Blame takes an item the kernel refused with err. It may return items to try after
	// everything else (a follow-up of the refusal, such as writing the item's last good
	// version back), or an error, which ends the search.
	Blame func(item T, err error) (again []T, stop error)
	// Budget bounds the failed attempts; nil for none.
	Budget *Budget
}

// Run commits the batches, in order, and returns what ended the search early (nil when
// every batch was taken or its culprits blamed).
func (s Search[T]) Run(batches [][]T) error {
	queue := batches
	for len(queue) > 0 {
		batch := queue[0]
		queue = queue[1:]
		if len(batch) == 0 {
			continue
		}
		out := s.Try(batch)
		if out.Err == nil {
			continue
		}
		if out.Stop {
			return out.Err
		}
		if err := s.Budget.Spend(); err != nil {
			return err
		}
		blamed := out.Blamed
		if len(blamed) == 0 {
			if len(batch) > 1 {
				half := len(batch) / 2
				queue = append([][]T{batch[:half], batch[half:]}, queue...)
				continue
			}
			blamed = map[int]error{0: out.Err}
		}
		rest := make([]T, 0, len(batch)-len(blamed))
		var again []T
		for i, item := range batch {
			err, bad := blamed[i]
			if !bad {
				rest = append(rest, item)
				continue
			}
			s.Budget.Blamed()
			next, stop := s.Blame(item, err)
			if stop != nil {
				return stop
			}
			again = append(again, next...)
		}
		if len(rest) > 0 {
			queue = append([][]T{rest}, queue...)
		}
		if len(again) > 0 {
			queue = append(queue, again)
		}
	}
	return nil
}

// Budget bounds the failed attempts of a search: a few rounds of halving, plus a few more
// for each item found guilty (each culprit needs its own attempts to be found). Attempts
// that succeed are progress and cost nothing. Every step makes progress, so this only
// guards against spending minutes (of a legacy xtables lock, say) on a failure that is
// not the items' fault. A nil Budget is unbounded.
type Budget struct{ left, perCulprit int }

// NewBudget returns the budget of a search among n items: 12 + 2 log2(n) failed attempts,
// and log2(n) + 2 more for each culprit.
func NewBudget(n int) *Budget {
	log := 0
	for ; n > 0; n >>= 1 {
		log++
	}
	return &Budget{left: 12 + 2*log, perCulprit: log + 2}
}

// ErrExhausted ends a search whose Budget is spent.
var ErrExhausted = errors.New("giving up isolating failing Services after too many failed attempts")

// Spend takes one failed attempt from b, or returns ErrExhausted when none is left.
func (b *Budget) Spend() error {
	if b == nil {
		return nil
	}
	if b.left <= 0 {
		return fmt.Errorf("%w", ErrExhausted)
	}
	b.left--
	return nil
}

// Blamed gives b the attempts of one more culprit found.
func (b *Budget) Blamed() {
	if b != nil {
		b.left += b.perCulprit
	}
}
