package stats

import (
	"math"
	"testing"
)

func TestMedian(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if m := Median(xs); m != 3 {
		t.Fatalf("median %v, want 3", m)
	}
	if xs[0] != 5 || xs[4] != 3 {
		t.Fatalf("Median reordered its input: %v", xs)
	}
	if m := Median([]float64{4, 1, 3, 2}); m != 2 {
		t.Fatalf("median of four %v, want 2 (nearest rank)", m)
	}
	if m := Median(nil); m != 0 {
		t.Fatalf("median of none %v", m)
	}
}

// The bootstrap interval of a median holds the sample median, narrows as
// the samples agree, is the same for the same seed, and of a ratio of two
// groups' medians straddles the true ratio.
func TestBootstrapCI(t *testing.T) {
	median := func(g [][]float64) float64 { return Median(g[0]) }
	spread := []float64{8, 9, 10, 10, 11, 12, 9.5, 10.5, 7, 13}
	lo, hi := BootstrapCI([][]float64{spread}, median, 0.95, 2000, 1)
	if m := Median(spread); !(lo <= m && m <= hi && lo < hi) {
		t.Fatalf("interval [%v, %v] of median %v", lo, hi, m)
	}
	if lo < 7 || hi > 13 {
		t.Fatalf("interval [%v, %v] past the samples", lo, hi)
	}
	if lo2, hi2 := BootstrapCI([][]float64{spread}, median, 0.95, 2000, 1); lo2 != lo || hi2 != hi {
		t.Fatalf("the same seed gave [%v, %v], then [%v, %v]", lo, hi, lo2, hi2)
	}
	tight := []float64{10, 10, 10, 10.01, 9.99, 10, 10, 10, 10, 10}
	if tlo, thi := BootstrapCI([][]float64{tight}, median, 0.95, 2000, 1); thi-tlo >= hi-lo || tlo > 10 || thi < 10 {
		t.Fatalf("agreeing samples' interval [%v, %v], spread ones' [%v, %v]", tlo, thi, lo, hi)
	}
	if wlo, whi := BootstrapCI([][]float64{spread}, median, 0.5, 2000, 1); wlo < lo || whi > hi {
		t.Fatalf("the 50%% interval [%v, %v] is not inside the 95%% one [%v, %v]", wlo, whi, lo, hi)
	}
	ratio := func(g [][]float64) float64 { return Median(g[0]) / Median(g[1]) }
	double := make([]float64, len(spread))
	for i, x := range spread {
		double[i] = 2 * x
	}
	rlo, rhi := BootstrapCI([][]float64{double, spread}, ratio, 0.95, 2000, 7)
	if !(rlo < 2 && 2 < rhi) || math.IsNaN(rlo) {
		t.Fatalf("the ratio's interval [%v, %v] does not hold 2", rlo, rhi)
	}
	if lo, hi := BootstrapCI([][]float64{spread}, median, 0.95, 0, 1); lo != 0 || hi != 0 {
		t.Fatalf("no resamples gave [%v, %v]", lo, hi)
	}
}
