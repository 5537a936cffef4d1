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
	for _, p := range rep.Points {
		if p.Passed && p.OfferedBlockOpsPerSec > rep.BlockOpsPerSec {
			xs := slices.Clone(p.BlockOpsPerLaneCPU)
			slices.Sort(xs)
			rep.BlockOpsPerSec, rep.PerLaneCPU = p.OfferedBlockOpsPerSec, stats.Percentile(xs, 0.5)
		}
	}
	return rep, nil
}
