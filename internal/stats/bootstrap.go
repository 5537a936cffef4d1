package stats

import (
	"math/rand/v2"
	"slices"
)

// Median returns the nearest-rank median of xs (see Percentile), leaving
// xs as it was; 0 for no samples.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return Percentile(s, 0.5)
}

// BootstrapCI returns the percentile-bootstrap interval, at level (0.95
// for 95%), of stat over groups of samples: resamples times, each group
// is drawn anew with replacement, at its own size, and stat computed over
// the draws; the interval is the draws' (1-level)/2 and (1+level)/2
// nearest-rank quantiles. The draws come from seed, so that a report is
// the same each time it is computed from the same samples. An empty
// group leaves stat's input empty; no resamples give (0, 0).
func BootstrapCI(groups [][]float64, stat func(groups [][]float64) float64, level float64, resamples int, seed uint64) (lo, hi float64) {
	if resamples <= 0 {
		return 0, 0
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	draw := make([][]float64, len(groups))
	for i, g := range groups {
		draw[i] = make([]float64, len(g))
	}
	stats := make([]float64, resamples)
	for r := range stats {
		for i, g := range groups {
			for j := range draw[i] {
				draw[i][j] = g[rng.IntN(len(g))]
			}
		}
		stats[r] = stat(draw)
	}
	slices.Sort(stats)
	return Percentile(stats, (1-level)/2), Percentile(stats, (1+level)/2)
}
