package main

import (
	"math"
	"slices"
	"time"
)

// Distribution summarises samples in microseconds.
type Distribution struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50Micros"`
	P90  float64 `json:"p90Micros"`
	P99  float64 `json:"p99Micros"`
	Mean float64 `json:"meanMicros"`
	Min  float64 `json:"minMicros"`
	Max  float64 `json:"maxMicros"`
}

func distributionOf(samples []time.Duration) Distribution {
	if len(samples) == 0 {
		return Distribution{}
	}
	us := make([]float64, len(samples))
	var sum float64
	for i, d := range samples {
		us[i] = float64(d) / float64(time.Microsecond)
		sum += us[i]
	}
	slices.Sort(us)
	return Distribution{
		N: len(us), P50: quantile(us, 0.50), P90: quantile(us, 0.90), P99: quantile(us, 0.99),
		Mean: sum / float64(len(us)), Min: us[0], Max: us[len(us)-1],
	}
}

// quantile of sorted values, by the nearest-rank method.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(q*float64(len(sorted)))) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

// median of values (the mean of the middle two for an even count); NaN when empty.
func median(values []float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	s := slices.Clone(values)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
