package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The proxies' own sync histogram, as upstream names it (sluice uses the same names).
const (
	metricSyncDuration        = "kubeproxy_sync_proxy_rules_duration_seconds"
	metricSyncPartialDuration = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	metricSyncFullDuration    = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	metricServicesFailed      = "sluice_services_failed"
	metricNetworkProgramming  = "kubeproxy_network_programming_duration_seconds"
	metricSyncLastTimestamp   = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
)

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics is one scrape.
type metrics []sample

// parseMetrics reads the Prometheus text exposition format. It keeps what this program
// reads (name, labels, value) and skips comments, timestamps and lines it cannot parse.
func parseMetrics(text string) metrics {
	var out metrics
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		s, ok := parseSample(line)
		if ok {
			out = append(out, s)
		}
	}
	return out
}

func parseSample(line string) (sample, bool) {
	s := sample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, false
	}
	s.name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		end, ok := parseLabels(rest[1:], s.labels)
		if !ok {
			return s, false
		}
		rest = rest[1+end:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, false
	}
	s.value = v
	return s, true
}

// parseLabels reads `k="v",k2="v2"}` into into, returning the index just past the '}'.
func parseLabels(s string, into map[string]string) (int, bool) {
	i := 0
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == ',') {
			i++
		}
		if i >= len(s) {
			return 0, false
		}
		if s[i] == '}' {
			return i + 1, true
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 || i+eq+1 >= len(s) || s[i+eq+1] != '"' {
			return 0, false
		}
		key := strings.TrimSpace(s[i : i+eq])
		i += eq + 2
		var val strings.Builder
		for {
			if i >= len(s) {
				return 0, false
			}
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				switch s[i+1] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i+1])
				}
				i += 2
				continue
			}
			i++
			if c == '"' {
				break
			}
			val.WriteByte(c)
		}
		into[key] = val.String()
	}
}

// sum adds up the samples named name whose labels include every pair of match; ok is
// false when there is none.
func (m metrics) sum(name string, match map[string]string) (total float64, ok bool) {
	for _, s := range m {
		if s.name != name {
			continue
		}
		matches := true
		for k, v := range match {
			if s.labels[k] != v {
				matches = false
				break
			}
		}
		if matches {
			total += s.value
			ok = true
		}
	}
	return total, ok
}

// histogram is the count and sum of a histogram (every matching series added up).
type histogram struct {
	Count float64
	Sum   float64
}

// ipv4 selects the IPv4 series: the dataset is IPv4 only, and a dual-stack proxy may
// observe (empty) IPv6 syncs too.
var ipv4 = map[string]string{"ip_family": "IPv4"}

func (m metrics) histogram(name string) histogram {
	c, _ := m.sum(name+"_count", ipv4)
	s, _ := m.sum(name+"_sum", ipv4)
	return histogram{Count: c, Sum: s}
}

// minus is the histogram of the observations made between two scrapes.
func (h histogram) minus(before histogram) histogram {
	return histogram{Count: h.Count - before.Count, Sum: h.Sum - before.Sum}
}

// mean is the average observation, 0 without any.
func (h histogram) mean() float64 {
	if h.Count <= 0 {
		return 0
	}
	return h.Sum / h.Count
}

var metricsClient = &http.Client{Timeout: 5 * time.Second}

// scrape fetches and parses url.
func scrape(ctx context.Context, url string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseMetrics(string(body)), nil
}

// histogramBuckets is a whole histogram (IPv4 series): its cumulative buckets, by upper
// bound, and its count and sum.
type histogramBuckets struct {
	Buckets []bucket `json:"buckets,omitempty"`
	Count   float64  `json:"count"`
	Sum     float64  `json:"sum"`
}

// bucket is one cumulative bucket: Count observations at or under Le (+Inf is left out).
type bucket struct {
	Le    float64 `json:"le"`
	Count float64 `json:"count"`
}

// buckets reads histogram name's IPv4 series.
func (m metrics) buckets(name string) histogramBuckets {
	h := m.histogram(name)
	out := histogramBuckets{Count: h.Count, Sum: h.Sum}
	byLe := map[float64]float64{}
	for _, s := range m {
		if s.name != name+"_bucket" || s.labels["ip_family"] != "IPv4" {
			continue
		}
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil || math.IsInf(le, 1) {
			continue
		}
		byLe[le] += s.value
	}
	for le, c := range byLe {
		out.Buckets = append(out.Buckets, bucket{Le: le, Count: c})
	}
	slices.SortFunc(out.Buckets, func(a, b bucket) int { return cmp.Compare(a.Le, b.Le) })
	return out
}

// minus is the histogram of the observations made between two scrapes (buckets matched
// by bound).
func (h histogramBuckets) minus(before histogramBuckets) histogramBuckets {
	out := histogramBuckets{Count: h.Count - before.Count, Sum: h.Sum - before.Sum}
	prev := map[float64]float64{}
	for _, b := range before.Buckets {
		prev[b.Le] = b.Count
	}
	for _, b := range h.Buckets {
		out.Buckets = append(out.Buckets, bucket{Le: b.Le, Count: b.Count - prev[b.Le]})
		// The buckets past the one holding every observation say nothing more.
		if b.Count-prev[b.Le] >= out.Count {
			break
		}
	}
	return out
}
