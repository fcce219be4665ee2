package isolate

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// kernel refuses a batch holding any bad item; it names the bad item when named is set.
type kernel struct {
	bad       map[int]bool
	named     bool
	committed []int
	attempts  []string
}

func (k *kernel) try(batch []int) Outcome {
	k.attempts = append(k.attempts, fmt.Sprint(batch))
	blamed := map[int]error{}
	for i, item := range batch {
		if k.bad[item] {
			blamed[i] = fmt.Errorf("item %d refused", item)
		}
	}
	if len(blamed) == 0 {
		k.committed = append(k.committed, batch...)
		return Taken
	}
	if !k.named {
		return Outcome{Err: errors.New("refused at commit")}
	}
	return Outcome{Err: errors.New("refused"), Blamed: blamed}
}

func items(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestRunCommitsEverythingButTheCulprits(t *testing.T) {
	tests := []struct {
		name     string
		bad      []int
		named    bool
		want     []int
		attempts int
	}{
		{name: "nothing bad", want: items(8), attempts: 1},
		{name: "named culprits leave at once", bad: []int{2, 5}, named: true, want: []int{0, 1, 3, 4, 6, 7}, attempts: 2},
		{name: "a nameless refusal is halved", bad: []int{5}, want: []int{0, 1, 2, 3, 4, 6, 7},
			// [0..7] [0..3] [4..7] [4 5] [4] [5] [6 7]
			attempts: 7},
		{name: "two nameless culprits", bad: []int{0, 7}, want: []int{1, 2, 3, 4, 5, 6}, attempts: 11},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := &kernel{bad: map[int]bool{}, named: tc.named}
			for _, b := range tc.bad {
				k.bad[b] = true
			}
			var blamed []string
			s := Search[int]{Try: k.try, Blame: func(item int, err error) ([]int, error) {
				blamed = append(blamed, fmt.Sprintf("%d: %v", item, err))
				return nil, nil
			}, Budget: NewBudget(8)}
			if err := s.Run([][]int{items(8)}); err != nil {
				t.Fatal(err)
			}
			slices.Sort(k.committed)
			if !slices.Equal(k.committed, tc.want) {
				t.Errorf("committed %v, want %v", k.committed, tc.want)
			}
			if len(blamed) != len(tc.bad) {
				t.Errorf("blamed %v, want %v", blamed, tc.bad)
			}
			if len(k.attempts) != tc.attempts {
				t.Errorf("%d attempts (%s), want %d", len(k.attempts), strings.Join(k.attempts, " "), tc.attempts)
			}
		})
	}
}

func TestRunKeepsBatchesAndQueuesFollowUps(t *testing.T) {
	k := &kernel{bad: map[int]bool{1: true}, named: true}
	s := Search[int]{Try: k.try, Blame: func(item int, _ error) ([]int, error) { return []int{item + 100}, nil }}
	if err := s.Run([][]int{{0, 1}, {2, 3}}); err != nil {
		t.Fatal(err)
	}
	want := []string{"[0 1]", "[0]", "[2 3]", "[101]"}
	if !slices.Equal(k.attempts, want) {
		t.Errorf("attempts %v, want %v (a batch's rest first, follow-ups last)", k.attempts, want)
	}
}

func TestRunStops(t *testing.T) {
	stop := errors.New("the lock is held")
	s := Search[int]{Try: func([]int) Outcome { return Outcome{Err: stop, Stop: true} }}
	if err := s.Run([][]int{{1}, {2}}); !errors.Is(err, stop) {
		t.Errorf("a stopping outcome: %v", err)
	}
	byBlame := errors.New("cannot even remove it")
	k := &kernel{bad: map[int]bool{0: true}, named: true}
	s = Search[int]{Try: k.try, Blame: func(int, error) ([]int, error) { return nil, byBlame }}
	if err := s.Run([][]int{{0, 1}}); !errors.Is(err, byBlame) {
		t.Errorf("a stopping blame: %v", err)
	}
	// Every item bad and nobody named: the budget ends the search.
	k = &kernel{bad: map[int]bool{}}
	for i := range 1000 {
		k.bad[i] = true
	}
	s = Search[int]{Try: k.try, Blame: func(int, error) ([]int, error) { return nil, nil }, Budget: &Budget{left: 5, perCulprit: 0}}
	if err := s.Run([][]int{items(1000)}); !errors.Is(err, ErrExhausted) {
		t.Errorf("an exhausted budget: %v", err)
	}
}
