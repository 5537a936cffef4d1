package openloop

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvradix/kvradix/internal/stats"
)

// The sustained rate, as Dynamo's and SMG's threshold protocol finds it: a
// point (a window, so an offered rate) passes when each of SustainedRuns
// fresh processes keeps up, its generator valid and its achieved rate at
// least 99% of the offered; from the first window the window halves while
// points pass (or doubles while they fail) until the threshold is
// bracketed, then is bisected geometrically until the failing and passing
// windows are within 10%. The sustained rate is the fastest passing
// point's offered block operations per second.

// SustainedRuns is the number of fresh processes a point runs; a point
// stops at its first failing process.
const SustainedRuns = 3

const sustainedRatio = 1.1

// SustainedPoint is one window the search tried.
type SustainedPoint struct {
	WindowMs               float64   `json:"window_ms"`
	OfferedBlockOpsPerSec  float64   `json:"offered_block_ops_per_sec"`
	Passed                 bool      `json:"passed"`
	AchievedBlockOpsPerSec []float64 `json:"achieved_block_ops_per_sec"` // per process
	BlockOpsPerLaneCPU     []float64 `json:"achieved_block_ops_per_lane_cpu_sec"`
	IssuerCPUFraction      []float64 `json:"issuer_cpu_fraction"`
	HostStealFraction      []float64 `json:"host_steal_fraction"`
	HostOtherFraction      []float64 `json:"host_other_fraction"`
}

// Sustained is the search's outcome.
type Sustained struct {
	Command string `json:"command"`
	// BlockOpsPerSec is the fastest passing point's offered rate;
	// PerLaneCPU, the median of its processes' block operations per
	// second of the index's CPU.
	BlockOpsPerSec float64          `json:"sustained_block_ops_per_sec"`
	PerLaneCPU     float64          `json:"sustained_block_ops_per_lane_cpu_sec"`
	Points         []SustainedPoint `json:"points"`
	Trials         *Trials          `json:"trials,omitempty"` // the confirmation at the sustained point, if run
}

// Passes reports whether one process's run passes a point.
func (r *Result) Passes() bool {
	return r.KeptUp && r.GeneratorValid && r.AchievedBlockOpsPerSec >= 0.99*r.OfferedBlockOpsPerSec
}

// FindSustained searches the sustained rate from the window first, within
// [1 ms, longest]. run runs the k-th fresh process of the point at window
// w; stopped, polled between runs, ends the search early with what it has.
func FindSustained(first, longest time.Duration, run func(w time.Duration, k int) (*Result, error), stopped func() bool) (Sustained, error) {
	var rep Sustained
	point := func(w time.Duration) (bool, error) {
		p := SustainedPoint{WindowMs: float64(w) / 1e6, Passed: true}
		for k := range SustainedRuns {
			r, err := run(w, k)
			if err != nil {
				return false, fmt.Errorf("window %v, process %d: %w", w, k+1, err)
			}
			p.OfferedBlockOpsPerSec = r.OfferedBlockOpsPerSec
			p.AchievedBlockOpsPerSec = append(p.AchievedBlockOpsPerSec, r.AchievedBlockOpsPerSec)
			p.BlockOpsPerLaneCPU = append(p.BlockOpsPerLaneCPU, r.AchievedBlockOpsPerLaneCPU)
			p.IssuerCPUFraction = append(p.IssuerCPUFraction, r.IssuerCPUFraction)
			p.HostStealFraction = append(p.HostStealFraction, r.HostStealFraction)
			p.HostOtherFraction = append(p.HostOtherFraction, r.HostOtherFraction)
			if !r.Passes() {
				p.Passed = false
				break // the point has failed: no need for the other processes
			}
		}
		rep.Points = append(rep.Points, p)
		return p.Passed, nil
	}
	// Bracket the threshold: halve the window while points pass, or
	// double it while they fail.
	pass, fail := time.Duration(0), time.Duration(0) // the windows: pass longer than fail
	for w := first; (pass == 0 || fail == 0) && w >= time.Millisecond && w <= longest && !stopped(); {
		ok, err := point(w)
		if err != nil {
			return rep, err
		}
		if ok {
			pass, w = w, w/2
		} else {
			fail, w = w, w*2
		}
	}
	for pass > 0 && fail > 0 && float64(pass)/float64(fail) > sustainedRatio && !stopped() {
		w := time.Duration(math.Sqrt(float64(pass) * float64(fail)))
		ok, err := point(w)
		if err != nil {
			return rep, err
		}
		if ok {
			pass = w
		} else {
			fail = w
		}
	}
	if p := rep.point(); p != nil {
		rep.BlockOpsPerSec, rep.PerLaneCPU = p.OfferedBlockOpsPerSec, stats.Median(p.BlockOpsPerLaneCPU)
	}
	return rep, nil
}

// point returns the sustained point: the passing point of the fastest
// offered rate, or nil if none passed.
func (s *Sustained) point() *SustainedPoint {
	var best *SustainedPoint
	for i, p := range s.Points {
		if p.Passed && (best == nil || p.OfferedBlockOpsPerSec > best.OfferedBlockOpsPerSec) {
			best = &s.Points[i]
		}
	}
	return best
}

// Trials is the confirmation the field runs after the search: fresh
// processes at the sustained point's window, alternating two arms of the
// same binary and arguments, A and A' (an A/A control), each figure with
// a 95% percentile-bootstrap interval. The A/A ratio is how far two runs
// of one binary differ on this machine at this hour: a difference
// between two binaries inside its interval is not one this machine can
// show.
type Trials struct {
	WindowMs              float64    `json:"window_ms"`
	OfferedBlockOpsPerSec float64    `json:"offered_block_ops_per_sec"`
	Runs                  []TrialRun `json:"runs"`
	PassedFraction        float64    `json:"passed_fraction"` // the runs that pass the point (Result.Passes)
	// Every run's block operations per second achieved, and per second
	// of the index's CPU: the median and its interval.
	AchievedBlockOpsPerSec Estimate `json:"achieved_block_ops_per_sec"`
	BlockOpsPerLaneCPU     Estimate `json:"achieved_block_ops_per_lane_cpu_sec"`
	// AAPerLaneCPURatio is arm A's median per lane CPU-second over arm
	// A''s, with its interval (each arm resampled on its own).
	AAPerLaneCPURatio Estimate `json:"aa_per_lane_cpu_ratio"`
}

// trialArms are the trials' two arms, taken in turn.
var trialArms = [2]string{"A", "A'"}

// TrialRun is one fresh process of the trials.
type TrialRun struct {
	Arm                    string  `json:"arm"` // "A" or "A'"
	Passed                 bool    `json:"passed"`
	AchievedBlockOpsPerSec float64 `json:"achieved_block_ops_per_sec"`
	BlockOpsPerLaneCPU     float64 `json:"achieved_block_ops_per_lane_cpu_sec"`
}

// Estimate is a median and its 95% bootstrap interval.
type Estimate struct {
	Median float64    `json:"median"`
	CI95   [2]float64 `json:"ci95"`
}

// bootstrap is how the trials' intervals are drawn: resamples and a fixed
// seed, so that the same runs give the same report.
const (
	bootstrapResamples = 2000
	bootstrapSeed      = 1
)

// Confirm runs n trials (see Trials) at the sustained point, after
// FindSustained: run and stopped are as there, k counting the trials. It
// does nothing where no point passed or the search was stopped; a
// confirmation interrupted or failed keeps the runs it has, summarised.
func (s *Sustained) Confirm(n int, run func(w time.Duration, k int) (*Result, error), stopped func() bool) error {
	p := s.point()
	if p == nil || n <= 0 || stopped() {
		return nil
	}
	w := time.Duration(math.Round(p.WindowMs * 1e6))
	t := &Trials{WindowMs: p.WindowMs, OfferedBlockOpsPerSec: p.OfferedBlockOpsPerSec}
	s.Trials = t
	defer t.summarise()
	for k := 0; k < n && !stopped(); k++ {
		r, err := run(w, k)
		if err != nil {
			return fmt.Errorf("trial %d at window %v: %w", k+1, w, err)
		}
		t.Runs = append(t.Runs, TrialRun{Arm: trialArms[k%2], Passed: r.Passes(),
			AchievedBlockOpsPerSec: r.AchievedBlockOpsPerSec, BlockOpsPerLaneCPU: r.AchievedBlockOpsPerLaneCPU})
	}
	return nil
}

// summarise computes the trials' fractions and estimates from their runs.
func (t *Trials) summarise() {
	if len(t.Runs) == 0 {
		return
	}
	var achieved, lane []float64
	var arms [2][]float64 // per lane CPU-second: A, A'
	passed := 0
	for _, r := range t.Runs {
		if r.Passed {
			passed++
		}
		achieved, lane = append(achieved, r.AchievedBlockOpsPerSec), append(lane, r.BlockOpsPerLaneCPU)
		arm := slices.Index(trialArms[:], r.Arm)
		arms[arm] = append(arms[arm], r.BlockOpsPerLaneCPU)
	}
	t.PassedFraction = float64(passed) / float64(len(t.Runs))
	t.AchievedBlockOpsPerSec, t.BlockOpsPerLaneCPU = MedianEstimate(achieved), MedianEstimate(lane)
	// The ratio needs both arms, and A' figures above 0 (a system that
	// reports no lane CPU gives 0s, and an infinite ratio has no JSON).
	if len(arms[1]) > 0 && slices.Min(arms[1]) > 0 {
		t.AAPerLaneCPURatio = estimate(func(g [][]float64) float64 { return stats.Median(g[0]) / stats.Median(g[1]) }, arms[:])
	}
}

// MedianEstimate is the median of xs with its 95% bootstrap interval, as
// the trials draw it.
func MedianEstimate(xs []float64) Estimate {
	return estimate(func(g [][]float64) float64 { return stats.Median(g[0]) }, [][]float64{xs})
}

// estimate is stat of groups with its 95% bootstrap interval.
func estimate(stat func([][]float64) float64, groups [][]float64) Estimate {
	lo, hi := stats.BootstrapCI(groups, stat, 0.95, bootstrapResamples, bootstrapSeed)
	return Estimate{Median: stat(groups), CI95: [2]float64{lo, hi}}
}
