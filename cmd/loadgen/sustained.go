package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/kvradix/kvradix/internal/stats"
)

// The sustained rate, as Dynamo's and SMG's threshold protocol finds it: a
// point (a window, so an offered rate) passes when each of sustainedRuns
// fresh processes keeps up, its generator valid and its achieved rate at
// least 99% of the offered; from -duration the window halves while points
// pass (or doubles while they fail) until the threshold is bracketed, then
// is bisected geometrically until the failing and passing rates are
// within 10%. The sustained rate is the fastest passing point's offered
// block operations per second.

const (
	sustainedRuns  = 3
	sustainedRatio = 1.1
)

type sustainedPoint struct {
	WindowMs           float64   `json:"window_ms"`
	OfferedBlockOpsS   float64   `json:"offered_block_ops_per_sec"`
	Passed             bool      `json:"passed"`
	AchievedBlockOpsS  []float64 `json:"achieved_block_ops_per_sec"` // per process
	BlockOpsPerLaneCPU []float64 `json:"achieved_block_ops_per_lane_cpu_sec"`
	IssuerCPUFraction  []float64 `json:"issuer_cpu_fraction"`
}

type sustainedReport struct {
	Command string `json:"command"`
	// SustainedBlockOpsS is the fastest passing point's offered rate;
	// SustainedPerLaneCPU, the median of its processes' block operations
	// per second of the index's CPU.
	SustainedBlockOpsS  float64          `json:"sustained_block_ops_per_sec"`
	SustainedPerLaneCPU float64          `json:"sustained_block_ops_per_lane_cpu_sec"`
	Points              []sustainedPoint `json:"points"`
}

// runSustained searches the sustained rate of one indexer (args name it,
// with -compare and -lanes), each point in fresh processes.
func runSustained(args []string, window time.Duration, out output, stdout, stderr io.Writer, intr *interrupt) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, cancel := intr.context()
	defer cancel()
	rep := sustainedReport{Command: commandLine("indexer", args)}
	child := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "-sustained" || a == "--sustained" })
	point := func(w time.Duration) (sustainedPoint, error) {
		p := sustainedPoint{WindowMs: float64(w) / 1e6, Passed: true}
		for k := range sustainedRuns {
			cmd := exec.CommandContext(ctx, exe, append(append([]string{"indexer"}, child...), "-duration", w.String(), "-repeat", "1", "-format", "json", "-quiet")...)
			cmd.Env = append(os.Environ(), childEnv+"=1")
			var buf bytes.Buffer
			cmd.Stdout, cmd.Stderr = &buf, stderr
			if err := cmd.Run(); err != nil {
				return p, fmt.Errorf("window %v, process %d: %w", w, k+1, err)
			}
			var r indexerReport
			if err := json.Unmarshal(buf.Bytes(), &r); err != nil || len(r.Results) != 1 {
				return p, fmt.Errorf("window %v, process %d: %d results (%v): name one indexer with -compare and -lanes", w, k+1, len(r.Results), err)
			}
			res := r.Results[0]
			p.OfferedBlockOpsS = res.OfferedBlockOpsS
			p.AchievedBlockOpsS = append(p.AchievedBlockOpsS, res.AchievedBlockOpS)
			p.BlockOpsPerLaneCPU = append(p.BlockOpsPerLaneCPU, res.BlockOpsPerLaneCPU)
			p.IssuerCPUFraction = append(p.IssuerCPUFraction, res.HarnessCPUFrac)
			if !res.KeptUp || !res.GeneratorValid || res.AchievedBlockOpS < 0.99*res.OfferedBlockOpsS {
				p.Passed = false
				break // the point has failed: no need for the other processes
			}
		}
		fmt.Fprintf(stderr, "window %v: %.3gM block-ops/s offered, passed %v\n", w, p.OfferedBlockOpsS/1e6, p.Passed)
		rep.Points = append(rep.Points, p)
		return p, nil
	}
	// Bracket the threshold: from -duration, halve the window while
	// points pass, or double it while they fail.
	pass, fail := time.Duration(0), time.Duration(0) // the windows: pass longer than fail
	for w := window; (pass == 0 || fail == 0) && w >= time.Millisecond && w <= maxDuration && !intr.Load(); {
		p, err := point(w)
		if err != nil {
			return err
		}
		if p.Passed {
			pass, w = w, w/2
			if fail != 0 {
				break
			}
		} else {
			fail, w = w, w*2
			if pass != 0 {
				break
			}
		}
	}
	for pass > 0 && fail > 0 && float64(pass)/float64(fail) > sustainedRatio && !intr.Load() {
		w := time.Duration(math.Sqrt(float64(pass) * float64(fail)))
		p, err := point(w)
		if err != nil {
			return err
		}
		if p.Passed {
			pass = w
		} else {
			fail = w
		}
	}
	for _, p := range rep.Points {
		if p.Passed && p.OfferedBlockOpsS > rep.SustainedBlockOpsS {
			xs := slices.Clone(p.BlockOpsPerLaneCPU)
			slices.Sort(xs)
			rep.SustainedBlockOpsS, rep.SustainedPerLaneCPU = p.OfferedBlockOpsS, stats.Percentile(xs, 0.5)
		}
	}
	err = out.write(stdout, rep, func() {
		fmt.Fprintf(stdout, "sustained: %.3gM block-ops/s (%.3gM per second of the index's CPU), %d points\n",
			rep.SustainedBlockOpsS/1e6, rep.SustainedPerLaneCPU/1e6, len(rep.Points))
	}, func() {})
	if err == nil && intr.Load() {
		err = errInterrupted
	}
	return err
}
