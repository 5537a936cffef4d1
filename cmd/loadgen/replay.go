package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/replay"
)

// settingsFlag collects repeated -sweep name=v1,v2,... flags.
type settingsFlag []replay.Setting

func (s *settingsFlag) String() string { return "" }

func (s *settingsFlag) Set(v string) error {
	set, err := replay.ParseSetting(v)
	if err != nil {
		return err
	}
	*s = append(*s, set)
	return nil
}

// tierWeightsFlag reads four comma-separated weights.
type tierWeightsFlag struct{ w *[kvevent.NumTiers]float64 }

func (f tierWeightsFlag) String() string {
	if f.w == nil || *f.w == ([kvevent.NumTiers]float64{}) {
		return ""
	}
	return fmt.Sprintf("%g,%g,%g,%g", f.w[0], f.w[1], f.w[2], f.w[3])
}

func (f tierWeightsFlag) Set(s string) error {
	parts := strings.Split(s, ",")
	if len(parts) != kvevent.NumTiers {
		return fmt.Errorf("%q: want %d weights, device first", s, kvevent.NumTiers)
	}
	for i, p := range parts {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(v >= 0) || math.IsInf(v, 1) {
			return fmt.Errorf("%q: weight %d is not a finite number >= 0", s, i)
		}
		f.w[i] = v
	}
	return nil
}

// replayConfig is what `loadgen replay` was asked to do.
type replayConfig struct {
	work    workloadFlags
	sim     replay.Config
	routers string
	sweep   settingsFlag
	out     output
	cpuprof string
}

func (c *replayConfig) register(fs *flag.FlagSet) {
	c.work.register(fs)
	c.sim = replay.DefaultConfig()
	cfg := &c.sim
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "workers")
	fs.IntVar(&cfg.DPSize, "dp-size", cfg.DPSize, "data-parallel ranks per worker: one mock engine each, scheduled apart")
	fs.IntVar(&cfg.Blocks, "blocks", cfg.Blocks, "KV blocks per engine")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.MaxBatchedTokens, "max-batched-tokens", cfg.MaxBatchedTokens, "tokens per engine step")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "running requests per engine")
	fs.Float64Var(&cfg.Speedup, "speedup", cfg.Speedup, "divide arrival times by this")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of tie-breaks, sampling and the random router")
	fs.Float64Var(&cfg.Temperature, "temperature", cfg.Temperature, "temperature of the kv_temp router")
	fs.Float64Var(&cfg.OverlapWeight, "overlap-weight", cfg.OverlapWeight, "weight of prefill blocks in the KV routers' cost")
	fs.Float64Var(&cfg.QueueThreshold, "queue-threshold", cfg.QueueThreshold, "KV routers queue while every worker's prefill exceeds this many batches (0: off)")
	fs.IntVar(&cfg.IndexerLanes, "lanes", cfg.IndexerLanes, "indexer lanes of the KV routers (1 = single-threaded)")
	fs.IntVar(&cfg.Replicas, "replicas", 1, "router replicas taking the requests in turn, each with its own index fed every event; they share their admissions (load, and the approximate routers' predictions) unless -isolated")
	fs.BoolVar(&cfg.Isolated, "isolated", false, "with -replicas, the replicas do not share admissions")
	fs.Float64Var(&cfg.Offload, "offload", 0, "give each engine a host tier of this many times its device blocks, which device evictions go to (0: none)")
	fs.Var(tierWeightsFlag{&cfg.TierWeights}, "tier-weights", "kv_tiers' prefill saved per block on the `device,host,disk,external` (default 1,0.8,0.5,0.3)")
	fs.StringVar(&c.routers, "routers", "round_robin,random,kv", "routers to compare: round_robin, random, kv, kv_temp, kv_tiers, kv_approx_lru, kv_approx_ttl, kv_predict")
	fs.Var(&c.sweep, "sweep", "sweep a KV router knob instead: `name=v1,v2,...` with name overlap_weight, temperature, queue_threshold, host_weight, approx_capacity (x true blocks), approx_ttl or predict_ttl (seconds); repeat for a grid")
	fs.StringVar(&c.cpuprof, "cpuprofile", "", "write a CPU profile of the replays to `file`")
	c.out.register(fs)
}

func runReplay(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("replay", stderr)
	var c replayConfig
	c.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	names, err := replay.ParseRouters(c.routers)
	if err != nil {
		return fmt.Errorf("-routers: %w", err)
	}
	if err := errors.Join(c.sim.Validate(), c.out.validate()); err != nil {
		return err
	}
	prof, err := createProfiles(c.cpuprof, "")
	if err != nil {
		return err
	}
	defer prof.close()
	intr, release := watch(stop)
	defer release()
	reqs, traceName, err := c.work.load()
	if err != nil {
		return err
	}
	if intr.Load() {
		fmt.Fprintln(stdout, "interrupted while loading the trace")
		return errInterrupted
	}
	ctx, cancel := intr.context()
	defer cancel()
	stopProfile, err := prof.cpu.startCPU()
	if err != nil {
		return err
	}
	defer stopProfile()
	command := commandLine("replay", args)
	if len(c.sweep) > 0 {
		rep, err := replay.SweepProgress(ctx, reqs, c.sweep, c.sim, sweepProgress(stderr, time.Now()))
		rep.Trace = traceName
		return c.report(stdout, replaySweepReport{command, rep}, err, func() { printSweep(stdout, rep) }, func() { printSweepBench(stdout, rep) })
	}
	rep, err := replay.Compare(ctx, reqs, names, c.sim)
	rep.Trace = traceName
	return c.report(stdout, replayReport{command, rep}, err, func() { printReplay(stdout, rep) }, func() { printReplayBench(stdout, rep.Results, nil) })
}

// sweepProgress reports on w how many of a sweep's replays are done, once
// the sweep has run past progressAfter: short sweeps stay quiet.
func sweepProgress(w io.Writer, start time.Time) func(done, total int) {
	return func(done, total int) {
		if d := time.Since(start); d >= progressAfter {
			fmt.Fprintf(w, "sweep: %d of %d replays done, %.1f s\n", done, total, d.Seconds())
		}
	}
}

// progressAfter is how long a sweep runs before it reports progress.
const progressAfter = 3 * time.Second

// replayReport and replaySweepReport add the command line to a report.
type replayReport struct {
	Command string `json:"command"`
	replay.Report
}

type replaySweepReport struct {
	Command string `json:"command"`
	replay.SweepReport
}

// report writes rep in the chosen format, unless err; after SIGINT it
// writes what finished (a router or point that did not shows no requests)
// and returns errInterrupted.
func (c *replayConfig) report(w io.Writer, rep any, err error, table, bench func()) error {
	interrupted := errors.Is(err, context.Canceled)
	if err != nil && !interrupted {
		return err
	}
	if err := c.out.write(w, rep, table, bench); err != nil {
		return err
	}
	if interrupted {
		fmt.Fprintln(w, "interrupted: a router or setting with 0 requests did not finish")
		return errInterrupted
	}
	return nil
}

// printReplayBench prints Go benchmark lines: a replay's "time per op" is
// its mean TTFT; reuse, efficiency and TTFT p99 ride along.
func printReplayBench(w io.Writer, results []replay.Result, names []string) {
	fmt.Fprintln(w, "pkg: github.com/kvradix/kvradix/cmd/loadgen")
	for i, r := range results {
		name := "router=" + r.Router
		if names != nil {
			name = names[i]
		}
		fmt.Fprintf(w, "BenchmarkReplay/%s 1 %.0f ns/op %.0f ttft-p99-ns %.4f reuse %.4f efficiency\n",
			name, r.TTFT.Mean*1e6, r.TTFT.P99*1e6, r.ReuseRatio, r.RoutingEfficiency)
	}
}

func printSweepBench(w io.Writer, rep replay.SweepReport) {
	var results []replay.Result
	var names []string
	for _, r := range rep.Results {
		results, names = append(results, r), append(names, "router="+r.Router)
	}
	for _, p := range rep.Points {
		name := "router=" + p.Router
		for _, k := range slices.Sorted(maps.Keys(p.Settings)) {
			name += fmt.Sprintf("/%s=%g", k, p.Settings[k])
		}
		results, names = append(results, p.Result), append(names, name)
	}
	printReplayBench(w, results, names)
}

func printReplayHeader(w io.Writer, rep replay.Report) {
	fmt.Fprintf(w, "trace: %s; %d workers x %d blocks of %d tokens; speedup %v; seed %d\n",
		rep.Trace, rep.Workers, rep.Blocks, rep.BlockSize, rep.Speedup, rep.Seed)
	if rep.Offload > 0 {
		fmt.Fprintf(w, "host tier: %g x each engine's blocks; the references know no host tier\n", rep.Offload)
	}
	if rep.Replicas > 1 {
		how := "sharing their admissions"
		if rep.Isolated {
			how = "isolated"
		}
		fmt.Fprintf(w, "router replicas: %d, taking the requests in turn, %s\n", rep.Replicas, how)
	}
	fmt.Fprintf(w, "reference reuse: pooled LRU of the fleet's blocks %.3f; unbounded cache %.3f\n\n", rep.ReusePooled, rep.ReuseUnbounded)
}

func printReplay(w io.Writer, rep replay.Report) {
	printReplayHeader(w, rep)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, f func(r replay.Result) string) {
		fmt.Fprintf(tw, "%s\t", label)
		for _, r := range rep.Results {
			fmt.Fprintf(tw, "%s\t", f(r))
		}
		fmt.Fprintln(tw)
	}
	ms := func(v float64) string { return fmt.Sprintf("%.1f", v) }
	row("", func(r replay.Result) string { return r.Router })
	row("requests", func(r replay.Result) string { return fmt.Sprint(r.Requests) })
	row("completed", func(r replay.Result) string { return fmt.Sprint(r.Completed) })
	row("rejected (too large)", func(r replay.Result) string { return fmt.Sprint(r.Rejected) })
	row("reuse ratio", func(r replay.Result) string { return fmt.Sprintf("%.3f", r.ReuseRatio) })
	if rep.Offload > 0 {
		row("  from the device", func(r replay.Result) string { return fmt.Sprintf("%.3f", r.ReuseByTier.Device) })
		row("  from the host", func(r replay.Result) string { return fmt.Sprintf("%.3f", r.ReuseByTier.HostPinned) })
	}
	row("routing efficiency", func(r replay.Result) string { return fmt.Sprintf("%.3f", r.RoutingEfficiency) })
	for _, d := range []struct {
		name string
		get  func(replay.Result) replay.Dist
	}{
		{"ttft", func(r replay.Result) replay.Dist { return r.TTFT }},
		{"tpot", func(r replay.Result) replay.Dist { return r.TPOT }},
		{"itl", func(r replay.Result) replay.Dist { return r.ITL }},
		{"e2e", func(r replay.Result) replay.Dist { return r.E2E }},
	} {
		row(d.name+" mean ms", func(r replay.Result) string { return ms(d.get(r).Mean) })
		row(d.name+" p50 ms", func(r replay.Result) string { return ms(d.get(r).P50) })
		row(d.name+" p90 ms", func(r replay.Result) string { return ms(d.get(r).P90) })
		row(d.name+" p99 ms", func(r replay.Result) string { return ms(d.get(r).P99) })
	}
	row("throughput req/s", func(r replay.Result) string { return fmt.Sprintf("%.2f", r.ThroughputRPS) })
	row("throughput tok/s", func(r replay.Result) string { return fmt.Sprintf("%.0f", r.ThroughputTPS) })
	row("requests/worker min", func(r replay.Result) string { return fmt.Sprint(r.Load.Min) })
	row("requests/worker max", func(r replay.Result) string { return fmt.Sprint(r.Load.Max) })
	row("requests/worker cv", func(r replay.Result) string { return fmt.Sprintf("%.3f", r.Load.CV) })
	row("index events rejected", func(r replay.Result) string { return fmt.Sprint(r.RejectedEvents) })
	row("approx precision", func(r replay.Result) string { return share(r.ApproxPrecision) })
	row("approx recall", func(r replay.Result) string { return share(r.ApproxRecall) })
	tw.Flush()
}

// share prints an optional share: "-" when there is none.
func share(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.4f", *v)
}

// printSweep prints one line per point, after the baselines.
func printSweep(w io.Writer, rep replay.SweepReport) {
	printReplayHeader(w, rep.Report)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "router\tsettings\treuse\tefficiency\tttft mean ms\tttft p90 ms\tttft p99 ms\trequests/worker cv\tapprox precision\tapprox recall\t")
	line := func(label, settings string, r replay.Result) {
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%.1f\t%.1f\t%.1f\t%.3f\t%s\t%s\t\n", label, settings,
			r.ReuseRatio, r.RoutingEfficiency, r.TTFT.Mean, r.TTFT.P90, r.TTFT.P99, r.Load.CV, share(r.ApproxPrecision), share(r.ApproxRecall))
	}
	for _, r := range rep.Results {
		line(r.Router, "(defaults)", r)
	}
	for _, p := range rep.Points {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(p.Settings)) {
			kv = append(kv, fmt.Sprintf("%s=%g", k, p.Settings[k]))
		}
		line(p.Router, strings.Join(kv, " "), p.Result)
	}
	tw.Flush()
}
