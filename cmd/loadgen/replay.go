package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"

	"github.com/kvradix/kvradix/replay"
)

type replayReport struct {
	Trace     string          `json:"trace"`
	Workers   int             `json:"workers"`
	Blocks    int             `json:"blocks"`
	BlockSize int             `json:"block_size"`
	Speedup   float64         `json:"speedup"`
	Seed      uint64          `json:"seed"`
	Results   []replay.Result `json:"results"`
}

func runReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", stderr)
	var wf workloadFlags
	wf.register(fs)
	cfg := replay.DefaultConfig()
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "mock engines")
	fs.IntVar(&cfg.Blocks, "blocks", cfg.Blocks, "KV blocks per engine")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.MaxBatchedTokens, "max-batched-tokens", cfg.MaxBatchedTokens, "tokens per engine step")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "running requests per engine")
	fs.Float64Var(&cfg.Speedup, "speedup", cfg.Speedup, "divide arrival times by this")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of tie-breaks, sampling and the random router")
	fs.Float64Var(&cfg.Temperature, "temperature", cfg.Temperature, "temperature of the kv_temp router")
	fs.IntVar(&cfg.IndexerLanes, "lanes", cfg.IndexerLanes, "indexer lanes of the KV routers (1 = single-threaded)")
	routers := fs.String("routers", "round_robin,random,kv", "routers to compare: round_robin, random, kv, kv_temp")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("replay: unexpected argument %q", fs.Arg(0))
	}
	names, err := replay.ParseRouters(*routers)
	if err != nil {
		return fmt.Errorf("-routers: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	reqs, name, err := wf.load()
	if err != nil {
		return err
	}
	rep := replayReport{Trace: name, Workers: cfg.Workers, Blocks: cfg.Blocks, BlockSize: cfg.BlockSize, Speedup: cfg.Speedup, Seed: cfg.Seed,
		Results: make([]replay.Result, len(names))}
	// Routers replay independently: run them side by side.
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep.Results[i], errs[i] = replay.Run(reqs, n, cfg)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("%s: %w", names[i], err)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printReplay(stdout, rep)
	return nil
}

func printReplay(w io.Writer, rep replayReport) {
	fmt.Fprintf(w, "trace: %s; %d workers x %d blocks of %d tokens; speedup %v; seed %d\n\n",
		rep.Trace, rep.Workers, rep.Blocks, rep.BlockSize, rep.Speedup, rep.Seed)
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
	tw.Flush()
}
