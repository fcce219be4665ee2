package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// promqlMetricNames returns the metric names an expression selects, in order of first
// appearance.
//
// Prometheus' own parser (github.com/prometheus/prometheus/promql/parser) would do this, but
// it pulls the Prometheus module with its TSDB into sluice's go.mod and moves shared
// dependencies; this scanner knows just enough of PromQL's lexical grammar for the queries
// we write, and refuses what it does not understand rather than guessing:
//
//   - strings, label matchers {...}, range and subquery brackets [...] and Grafana
//     variables ($name, ${name}, $__rate_interval) are skipped;
//   - an identifier followed by "(" is a function or aggregation, never a metric;
//   - by, without, on, ignoring, group_left and group_right take a parenthesised label list,
//     which is skipped; and, or, unless, bool, offset and the number words are keywords;
//   - any other identifier is a metric name.
func promqlMetricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	i := 0
	skipSpace := func(j int) int {
		for j < len(s) && strings.ContainsRune(" \t\r\n", rune(s[j])) {
			j++
		}
		return j
	}
	// skipTo returns the index after the closing rune of a bracket opened at s[j],
	// skipping strings inside.
	skipTo := func(j int, open, close byte) (int, error) {
		depth := 0
		for j < len(s) {
			switch s[j] {
			case '"', '\'', '`':
				end, err := skipString(s, j)
				if err != nil {
					return 0, err
				}
				j = end
				continue
			case open:
				depth++
			case close:
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
			j++
		}
		return 0, fmt.Errorf("unclosed %q at %d", open, j)
	}
	for {
		i = skipSpace(i)
		if i >= len(s) {
			return names, nil
		}
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{':
			end, err := skipTo(i, '{', '}')
			if err != nil {
				return nil, err
			}
			i = end
		case c == '[':
			end, err := skipTo(i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = end
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				end, err := skipTo(i, '{', '}')
				if err != nil {
					return nil, err
				}
				i = end
			} else {
				for i < len(s) && isIdentChar(s[i]) {
					i++
				}
			}
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			// A number or a duration (5m, 1h30m, 1e3, 0x1f).
			for i < len(s) && (isIdentChar(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			word := s[i:j]
			next := skipSpace(j)
			switch {
			case groupingKeywords[strings.ToLower(word)]:
				i = next
				if i < len(s) && s[i] == '(' {
					end, err := skipTo(i, '(', ')')
					if err != nil {
						return nil, err
					}
					i = end
				}
			case keywords[strings.ToLower(word)]:
				i = j
			case next < len(s) && s[next] == '(':
				i = j // a function or aggregation
			case aggregations[strings.ToLower(word)] && followedByGrouping(s[next:]):
				i = j // sum by (x) (...)
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
				i = j
			}
		case strings.ContainsRune("()+-*/%^=!<>,@", rune(c)):
			i++
		default:
			return nil, fmt.Errorf("unexpected %q at %d", c, i)
		}
	}
}

var groupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// aggregations are PromQL's aggregation operators, which may take their grouping before
// the parenthesised argument: sum by (le) (...).
var aggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true}

func followedByGrouping(rest string) bool {
	for kw := range map[string]bool{"by": true, "without": true} {
		if strings.HasPrefix(strings.ToLower(rest), kw) && (len(rest) == len(kw) || !isIdentChar(rest[len(kw)])) {
			return true
		}
	}
	return false
}

var keywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true, "atan2": true}

func skipString(s string, i int) (int, error) {
	quote := s[i]
	for j := i + 1; j < len(s); j++ {
		if s[j] == '\\' && quote != '`' {
			j++
			continue
		}
		if s[j] == quote {
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unclosed string at %d", i)
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdentChar(c byte) bool  { return isIdentStart(c) || isDigit(c) }

func TestPromQLMetricNames(t *testing.T) {
	cases := []struct {
		expr string
		want []string
	}{
		{`up{job="sluice"} == 0`, []string{"up"}},
		{`histogram_quantile(0.99, sum by (node, ip_family, le) (rate(a_bucket{job="$job", node=~"$node"}[$__rate_interval])))`, []string{"a_bucket"}},
		{`sum(rate(x_total[5m])) by (code) / ignoring(code) group_left sum(rate(y_total[5m]))`, []string{"x_total", "y_total"}},
		{`(time() - a{x="}"} > 300) and (b > a)`, []string{"a", "b"}},
		{`rate(c[5m] offset 1h) * on (instance) group_left(node) d`, []string{"c", "d"}},
		{`max by (node) (e) > 0 unless f{l="open}`, nil}, // an unclosed string is refused
		{`max by (node) (e) > 0 unless f{l='it\'s'}`, []string{"e", "f"}},
		{`sum without(le) (g:recorded:rate5m) > bool 1e3`, []string{"g:recorded:rate5m"}},
		{`topk(5, h{a=~"b|c"})`, []string{"h"}},
		{"i{a=`{raw}`} + 0x1F", []string{"i"}},
		{`label_join(j, "dst", ",", "a", "b")`, []string{"j"}},
	}
	for _, c := range cases {
		got, err := promqlMetricNames(c.expr)
		if c.want == nil {
			if err == nil {
				t.Errorf("%s: want an error, got %v", c.expr, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.expr, got, c.want)
		}
	}
}
