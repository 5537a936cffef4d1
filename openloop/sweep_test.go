package openloop

import (
	"encoding/json"
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

// The trials after a search run at the sustained point's window,
// alternating the arms A and A'; they report the share that passed, each
// figure's median with an interval around it, and the A/A ratio of the
// arms' per-lane figures with an interval holding the true one. No
// passing point or a stopped search, no trials; a failed process is an
// error, and it and a stop keep the trials run, summarised.
func TestConfirmSustained(t *testing.T) {
	rep := Sustained{Points: []SustainedPoint{
		{WindowMs: 200, OfferedBlockOpsPerSec: 5e6, Passed: true},
		{WindowMs: 100, OfferedBlockOpsPerSec: 10e6, Passed: true},
		{WindowMs: 50, OfferedBlockOpsPerSec: 20e6},
	}}
	const n = 20
	var windows []time.Duration
	run := func(w time.Duration, k int) (*Result, error) {
		windows = append(windows, w)
		lane := 10e6 + float64(k%5)*1e5 // arm A (even k) and A' (odd) spread alike
		if k%2 == 1 {
			lane *= 1.5 // ... but A' is half as fast again
		}
		r := &Result{OfferedBlockOpsPerSec: 10e6, AchievedBlockOpsPerSec: 10e6, KeptUp: k%4 != 3, GeneratorValid: true, AchievedBlockOpsPerLaneCPU: lane}
		return r, nil
	}
	if err := rep.Confirm(n, run, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	tr := rep.Trials
	if tr == nil || len(tr.Runs) != n || tr.WindowMs != 100 || tr.OfferedBlockOpsPerSec != 10e6 {
		t.Fatalf("%+v", tr)
	}
	for k, w := range windows {
		if w != 100*time.Millisecond {
			t.Fatalf("trial %d at window %v, want the sustained point's 100ms", k+1, w)
		}
		if want := [2]string{"A", "A'"}[k%2]; tr.Runs[k].Arm != want {
			t.Fatalf("trial %d in arm %q, want %q", k+1, tr.Runs[k].Arm, want)
		}
	}
	if tr.PassedFraction != 0.75 {
		t.Fatalf("passed %v, want 0.75", tr.PassedFraction)
	}
	within := func(name string, e Estimate, want float64) {
		t.Helper()
		if !(e.CI95[0] <= e.Median && e.Median <= e.CI95[1] && e.CI95[0] <= want && want <= e.CI95[1]) {
			t.Fatalf("%s: %+v does not hold %v", name, e, want)
		}
	}
	within("achieved", tr.AchievedBlockOpsPerSec, 10e6)
	within("per lane CPU", tr.BlockOpsPerLaneCPU, tr.BlockOpsPerLaneCPU.Median)
	within("A/A ratio", tr.AAPerLaneCPURatio, 1/1.5)
	if tr.AAPerLaneCPURatio.CI95[1] >= 1 {
		t.Fatalf("A/A ratio %+v: the arms' difference is not shown", tr.AAPerLaneCPURatio)
	}

	zero := Sustained{Points: rep.Points}
	if err := zero.Confirm(4, func(w time.Duration, k int) (*Result, error) {
		r, err := run(w, k)
		r.AchievedBlockOpsPerLaneCPU = 0 // a system that reports no lane CPU
		return r, err
	}, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	if e := zero.Trials.AAPerLaneCPURatio; e != (Estimate{}) {
		t.Fatalf("A/A ratio of zero figures %+v, want none", e)
	}
	if _, err := json.Marshal(zero); err != nil {
		t.Fatalf("trials of zero figures: %v", err)
	}

	none := Sustained{Points: []SustainedPoint{{WindowMs: 50, Passed: false}}}
	if err := none.Confirm(n, run, func() bool { return false }); err != nil || none.Trials != nil {
		t.Fatalf("no passing point: %v, %+v", err, none.Trials)
	}
	boom := errors.New("boom")
	failing := func(w time.Duration, k int) (*Result, error) {
		if k == 2 {
			return nil, boom
		}
		return run(w, k)
	}
	if err := rep.Confirm(n, failing, func() bool { return false }); !errors.Is(err, boom) || len(rep.Trials.Runs) != 2 || rep.Trials.PassedFraction != 1 || rep.Trials.BlockOpsPerLaneCPU.Median <= 0 {
		t.Fatalf("a process failing third: %v, trials %+v (want the first two kept, summarised)", err, rep.Trials)
	}
	stops := 0
	if err := rep.Confirm(n, run, func() bool { stops++; return stops > 4 }); err != nil || len(rep.Trials.Runs) != 3 {
		t.Fatalf("stopped after 3: %v, %d runs", err, len(rep.Trials.Runs))
	}
	stopped := Sustained{Points: rep.Points}
	if err := stopped.Confirm(n, run, func() bool { return true }); err != nil || stopped.Trials != nil {
		t.Fatalf("stopped before the first: %v, %+v", err, stopped.Trials)
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
