package openloop

import (
	"errors"
	"testing"
	"time"

	"github.com/kvradix/kvradix/shardpool"
)

// The sustained search against an indexer that passes exactly the windows
// of 100 ms and more: it brackets the threshold from either side, bisects
// until the passing and failing windows are within 10%, runs all three
// processes of a passing point and stops a point at its first failure,
// and reports the fastest passing point's offered rate.
func TestFindSustained(t *testing.T) {
	const blockOps = 1e6
	for _, first := range []time.Duration{time.Second, 10 * time.Millisecond} {
		runs := map[time.Duration]int{}
		run := func(w time.Duration, k int) (*Result, error) {
			runs[w]++
			offered := blockOps / w.Seconds()
			r := &Result{OfferedBlockOpsPerSec: offered, AchievedBlockOpsPerSec: offered, KeptUp: w >= 100*time.Millisecond, GeneratorValid: true,
				AchievedBlockOpsPerLaneCPU: float64(k + 1)}
			if !r.KeptUp {
				r.AchievedBlockOpsPerSec /= 2
			}
			return r, nil
		}
		rep, err := FindSustained(first, time.Minute, run, func() bool { return false })
		if err != nil {
			t.Fatal(err)
		}
		var pass, fail time.Duration
		for _, p := range rep.Points {
			w := time.Duration(p.WindowMs * 1e6)
			if p.Passed != (w >= 100*time.Millisecond) {
				t.Fatalf("from %v: window %v passed %v", first, w, p.Passed)
			}
			if want := map[bool]int{true: SustainedRuns, false: 1}[p.Passed]; runs[w] != want || len(p.AchievedBlockOpsPerSec) != want {
				t.Fatalf("from %v: window %v ran %d processes, want %d", first, w, runs[w], want)
			}
			if p.Passed && (pass == 0 || w < pass) {
				pass = w
			}
			if !p.Passed && w > fail {
				fail = w
			}
		}
		if fail == 0 || pass == 0 || float64(pass)/float64(fail) > sustainedRatio {
			t.Fatalf("from %v: bracket (%v, %v]", first, fail, pass)
		}
		if want := blockOps / pass.Seconds(); rep.BlockOpsPerSec != want || rep.PerLaneCPU != 2 {
			t.Fatalf("from %v: sustained %v (per lane CPU %v), want %v (2, the median process)", first, rep.BlockOpsPerSec, rep.PerLaneCPU, want)
		}
	}
	boom := errors.New("boom")
	if _, err := FindSustained(time.Second, time.Minute, func(time.Duration, int) (*Result, error) { return nil, boom }, func() bool { return false }); !errors.Is(err, boom) {
		t.Fatalf("a failed process: %v", err)
	}
}

// A sweep halves the window while runs pass (doubles it while they fail),
// then bisects; its result is the run at the shortest passing window (the
// last run if none passed), carrying every step.
func TestSweep(t *testing.T) {
	const first = time.Second
	c := smallCorpus(t, 1, 1, first)
	var windows []time.Duration
	var runs []*Result
	r := Sweep(c, shardpool.Impl{Name: "compressed", Lanes: 2}, Protocol{Issuers: 2, QueryLanes: 2}, 3, nil, func(w time.Duration, r *Result) {
		windows, runs = append(windows, w), append(runs, r)
	})
	if len(windows) != 3 || windows[0] != first || len(r.Sweep) != 3 {
		t.Fatalf("windows %v, %d points", windows, len(r.Sweep))
	}
	passed := func(r *Result) bool { return r.KeptUp && r.GeneratorValid }
	if want := map[bool]time.Duration{true: first / 2, false: 2 * first}[passed(runs[0])]; windows[1] != want {
		t.Fatalf("windows %v: the second, after the first passed %v, want %v", windows, passed(runs[0]), want)
	}
	want := runs[2]
	for i, x := range runs {
		if passed(x) && (!passed(want) || windows[i] < time.Duration(want.BenchmarkDurationMs)*time.Millisecond) {
			want = x
		}
	}
	if r != want {
		t.Fatalf("the result is the run at %d ms, want the one at %d ms", r.BenchmarkDurationMs, want.BenchmarkDurationMs)
	}
}
