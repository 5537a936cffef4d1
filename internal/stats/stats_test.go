package stats

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]float64{0: 1, 0.5: 5, 0.9: 9, 0.99: 10, 1: 10, 0.11: 2} {
		if got := Percentile(xs, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if Percentile(nil, 0.5) != 0 {
		t.Error("empty")
	}
}

func TestMicros(t *testing.T) {
	got := Micros([]time.Duration{3 * time.Microsecond, time.Microsecond}, nil, []time.Duration{2500 * time.Nanosecond})
	if len(got) != 3 || got[0] != 1 || got[1] != 2.5 || got[2] != 3 {
		t.Fatalf("%v", got)
	}
}

// TestSort: Sort orders like slices.Sort, on latencies (radix path, with
// duplicates, zeros and bytes shared by every key) and on samples with a
// negative or NaN (fallback), short and long.
func TestSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 100, 5000, 100000} {
		for _, kind := range []string{"latency", "coarse", "negative", "nan", "negzero"} {
			xs := make([]float64, n)
			for i := range xs {
				switch kind {
				case "coarse":
					xs[i] = float64(r.IntN(50)) * 0.25
				default:
					xs[i] = r.ExpFloat64() * 100
				}
			}
			if n > 0 {
				switch kind {
				case "negative":
					xs[r.IntN(n)] = -1
				case "nan":
					xs[r.IntN(n)] = math.NaN()
				case "negzero":
					xs[r.IntN(n)] = math.Copysign(0, -1)
				}
			}
			want := slices.Clone(xs)
			slices.Sort(want)
			Sort(xs)
			if !slices.EqualFunc(xs, want, func(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }) {
				t.Fatalf("%s n=%d: sorted differently from slices.Sort", kind, n)
			}
		}
	}
}
