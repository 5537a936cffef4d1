package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/kvradix/kvradix/openloop"
	"github.com/kvradix/kvradix/shardpool"
)

// childEnv marks a process run by -repeat (the test binary runs the
// command when it sees it).
const childEnv = "LOADGEN_CHILD"

// spread is a figure over repeated runs: its median, with the median's
// 95% bootstrap interval (openloop's, as the sustained trials draw it),
// and its range.
type spread struct {
	Median float64    `json:"median"`
	CI95   [2]float64 `json:"ci95"`
	Min    float64    `json:"min"`
	Max    float64    `json:"max"`
}

func spreadOf(xs []float64) spread {
	slices.Sort(xs)
	e := openloop.MedianEstimate(xs)
	return spread{Median: e.Median, CI95: e.CI95, Min: xs[0], Max: xs[len(xs)-1]}
}

type repeatSummary struct {
	Impl             string `json:"impl"`
	Lanes            int    `json:"lanes"`
	Runs             int    `json:"runs"`
	KeptUp           int    `json:"kept_up"`
	GeneratorValid   int    `json:"generator_valid"`
	AchievedBlockOpS spread `json:"achieved_block_ops_s"`
	PerLaneCPU       spread `json:"achieved_block_ops_per_lane_cpu_sec"`
	QueryServiceP50  spread `json:"query_service_p50_us"`
	QueryServiceP99  spread `json:"query_service_p99_us"`
}

type repeatReport struct {
	Command string               `json:"command"`
	Repeat  int                  `json:"repeat"`
	Summary []repeatSummary      `json:"summary"`
	Runs    [][]*openloop.Result `json:"runs"` // per process, its results
}

// runRepeated runs `loadgen indexer args` in n fresh processes, one after
// the other, and reports each indexer's median and spread.
func runRepeated(args []string, n int, out output, stdout, stderr io.Writer, intr *interrupt) error {
	rep := repeatReport{Command: commandLine("indexer", args), Repeat: n}
	for k := range n {
		rs, err := runChild(args, stderr, intr)
		if err != nil {
			if intr.Load() {
				break
			}
			return fmt.Errorf("run %d of %d: %w", k+1, n, err)
		}
		rep.Runs = append(rep.Runs, rs)
		fmt.Fprintf(stderr, "run %d of %d done\n", k+1, n)
	}
	rep.Summary = summarise(rep.Runs)
	err := out.write(stdout, rep, func() { printRepeated(stdout, rep) }, func() {
		for _, r := range rep.Runs {
			printIndexerBench(stdout, r)
		}
	})
	if err == nil && intr.Load() {
		err = errInterrupted
	}
	return err
}

// summarise groups the runs' results by indexer, in first-run order.
func summarise(runs [][]*openloop.Result) []repeatSummary {
	if len(runs) == 0 {
		return nil
	}
	var out []repeatSummary
	for j, first := range runs[0] {
		s := repeatSummary{Impl: first.Index, Lanes: first.Lanes}
		var ops, lane, p50, p99 []float64
		for _, run := range runs {
			if j >= len(run) {
				continue
			}
			r := run[j]
			s.Runs++
			if r.KeptUp {
				s.KeptUp++
			}
			if r.GeneratorValid {
				s.GeneratorValid++
			}
			ops, lane = append(ops, r.AchievedBlockOpsPerSec), append(lane, r.AchievedBlockOpsPerLaneCPU)
			p50, p99 = append(p50, us(r.QueryService.P50)), append(p99, us(r.QueryService.P99))
		}
		s.AchievedBlockOpS, s.PerLaneCPU = spreadOf(ops), spreadOf(lane)
		s.QueryServiceP50, s.QueryServiceP99 = spreadOf(p50), spreadOf(p99)
		out = append(out, s)
	}
	return out
}

func printRepeated(w io.Writer, rep repeatReport) {
	fmt.Fprintf(w, "%d runs, fresh processes:\n", len(rep.Runs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "index\tblock-ops/s median\t95% interval\tmin\tmax\tper lane CPU-s median\t95% interval\tkept up\tvalid\tlookup p50 µs\tp99 µs\t")
	for _, s := range rep.Summary {
		a, l := s.AchievedBlockOpS, s.PerLaneCPU
		fmt.Fprintf(tw, "%s\t%.3gM\t%.3gM–%.3gM\t%.3gM\t%.3gM\t%.3gM\t%.3gM–%.3gM\t%d/%d\t%d/%d\t%.1f\t%.1f\t\n", shardpool.Impl{Name: s.Impl, Lanes: s.Lanes},
			a.Median/1e6, a.CI95[0]/1e6, a.CI95[1]/1e6, a.Min/1e6, a.Max/1e6, l.Median/1e6, l.CI95[0]/1e6, l.CI95[1]/1e6,
			s.KeptUp, s.Runs, s.GeneratorValid, s.Runs, s.QueryServiceP50.Median, s.QueryServiceP99.Median)
	}
	tw.Flush()
}
