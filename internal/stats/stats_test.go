package stats

import (
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
