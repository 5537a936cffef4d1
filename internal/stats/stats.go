// Package stats is the module's one way of summarising a distribution:
// nearest-rank percentiles, so that every report rounds the same way.
package stats

import (
	"slices"
	"time"
)

// Percentile returns the nearest-rank p-quantile (0 <= p <= 1) of sorted:
// the smallest sample with at least p of the samples at or below it; the
// minimum for p = 0, and 0 for no samples.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Micros merges per-goroutine duration samples into one sorted slice of
// microseconds.
func Micros(parts ...[]time.Duration) []float64 {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]float64, 0, n)
	for _, p := range parts {
		for _, d := range p {
			out = append(out, float64(d.Nanoseconds())/1e3)
		}
	}
	slices.Sort(out)
	return out
}
