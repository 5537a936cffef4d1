package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/kvradix/kvradix/internal/stats"
	"github.com/kvradix/kvradix/openloop"
	"github.com/kvradix/kvradix/shardpool"
	"github.com/kvradix/kvradix/trace"
)

// maxDuration bounds -duration.
const maxDuration = 10 * time.Minute

// parseImpls reads -compare and -lanes.
func parseImpls(compare, lanes string) ([]shardpool.Impl, error) {
	ls, err := shardpool.ParseLanes(lanes)
	if err != nil {
		return nil, fmt.Errorf("-lanes: %w", err)
	}
	impls, err := shardpool.ParseImpls(compare, ls)
	if err != nil {
		return nil, fmt.Errorf("-compare: %w", err)
	}
	return impls, nil
}

// Latencies summarises FindMatches latency in µs.
type Latencies struct {
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
}

// latencies merges per-goroutine samples into percentiles, in µs.
func latencies(lat ...[]time.Duration) Latencies { return summary(stats.Micros(lat...)) }

// summary is sorted samples' percentiles.
func summary(sorted []float64) Latencies {
	return Latencies{P50: stats.Percentile(sorted, 0.5), P99: stats.Percentile(sorted, 0.99), P999: stats.Percentile(sorted, 0.999)}
}

// indexerConfig is what `loadgen indexer` was asked to do.
type indexerConfig struct {
	work       workloadFlags
	corpus     openloop.BuildConfig
	proto      openloop.Protocol
	out        output
	window     time.Duration
	compare    string
	lanes      string
	sweep      bool
	sweepSteps int
	repeat     int
	churn      bool
	quiet      bool
	cpuprofile string
	memprofile string
	corpusFile string // an SMGMCK01 corpus to replay instead of building one
	windowSet  bool   // -duration was given
	sustained  bool
	trials     int  // fresh processes confirming the sustained point
	sized      bool // compressed pools' tables sized for the engines' pools summed
}

func (c *indexerConfig) register(fs *flag.FlagSet) {
	c.work.register(fs)
	c.registerCorpus(fs)
	c.proto = openloop.Protocol{Issuers: 2, QueryLanes: runtime.GOMAXPROCS(0)}
	fs.IntVar(&c.proto.Issuers, "issuers", c.proto.Issuers, "goroutines issuing operations by deadline")
	fs.IntVar(&c.proto.QueryLanes, "query-lanes", c.proto.QueryLanes, "goroutines running lookups (Dynamo: 128)")
	c.registerWindow(fs)
	fs.StringVar(&c.compare, "compare", "single,pool,compressed", "indexers: single, pool (over ConcurrentTree), compressed (pool over CompressedTree)")
	fs.StringVar(&c.lanes, "lanes", "2", "pool lanes; a comma list runs one pool per value")
	fs.BoolVar(&c.sweep, "sweep", false, "find the shortest window that keeps up: halve -duration, then bisect")
	fs.IntVar(&c.sweepSteps, "sweep-steps", 6, "most sweep steps")
	fs.IntVar(&c.repeat, "repeat", 1, "run this many fresh processes and report the median and spread")
	fs.BoolVar(&c.churn, "churn", false, "soak: replay in passes for -duration while workers leave and rejoin; heap each second and after each pass, verdict flat or growing")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile to `file`")
	fs.StringVar(&c.memprofile, "memprofile", "", "write a heap profile to `file` at the end")
	fs.BoolVar(&c.sized, "sized", false, "size the compressed pool's table of engine hashes up front for the engines' pools summed (workers x dup x -blocks): no segment splits as it fills")
	fs.BoolVar(&c.sustained, "sustained", false, "find the sustained rate: each point in 3 fresh processes, all kept up at >= 99% of offered; the window halves from -duration, then bisects to 10% (one indexer: -compare and -lanes)")
	fs.IntVar(&c.trials, "trials", 0, "with -sustained: then run this many fresh processes at the sustained point, alternating two arms of the same binary (an A/A control), and report each figure's median with a 95% bootstrap interval and the A/A ratio's (the field: 20)")
	c.out.register(fs)
}

// registerWindow registers -duration, the window the corpus's deadlines
// are scaled to.
func (c *indexerConfig) registerWindow(fs *flag.FlagSet) {
	fs.DurationVar(&c.window, "duration", 20*time.Second, "the window every worker's timeline is rescaled to (at most 10m)")
}

// registerCorpus registers the flags that choose the corpus: the trace
// (workloadFlags), how it is spread and stretched, or a corpus file; and
// -quiet, for the progress of its build.
func (c *indexerConfig) registerCorpus(fs *flag.FlagSet) {
	c.corpus = openloop.BuildConfig{Workers: 128, BlockSize: 128, TraceBlockSize: trace.TraceBlockSize, Blocks: 16384, Dup: 1, LengthFactor: 1}
	fs.IntVar(&c.corpus.Workers, "workers", c.corpus.Workers, "simulated engines the trace is spread over (Dynamo: 128)")
	fs.IntVar(&c.corpus.Blocks, "blocks", c.corpus.Blocks, "KV blocks per engine")
	fs.IntVar(&c.corpus.BlockSize, "block-size", c.corpus.BlockSize, "tokens per KV block (Dynamo: 128)")
	fs.IntVar(&c.corpus.TraceBlockSize, "trace-block-size", c.corpus.TraceBlockSize, "tokens per trace hash id (Dynamo: 512)")
	fs.IntVar(&c.corpus.Dup, "dup", c.corpus.Dup, "copies of the trace in disjoint hash spaces, each on its own workers (Dynamo: 20)")
	fs.IntVar(&c.corpus.LengthFactor, "length-factor", c.corpus.LengthFactor, "stretch every request's hash ids this many times (Dynamo: 4)")
	fs.Uint64Var(&c.corpus.Seed, "seed", 0, "seed of the request-to-engine spread")
	fs.StringVar(&c.corpusFile, "corpus", "", "replay this SMGMCK01 corpus (loadgen corpus writes one) instead of building one from the trace; its deadlines are rescaled to -duration if given")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines on stderr")
}

// validate checks what every command that builds or reads a corpus
// takes: the window, the corpus and, if it reports one (fs has -format),
// the output.
func (c *indexerConfig) validate(fs *flag.FlagSet) error {
	if c.window <= 0 || c.window > maxDuration {
		return fmt.Errorf("-duration %v, want in (0, %v]", c.window, maxDuration)
	}
	if fs.Lookup("format") == nil {
		return c.corpus.Validate()
	}
	return errors.Join(c.corpus.Validate(), c.out.validate())
}

// validateRun checks what loadgen indexer takes besides: how it runs.
func (c *indexerConfig) validateRun() error {
	switch {
	case c.sweepSteps < 1:
		return fmt.Errorf("-sweep-steps %d, want >= 1", c.sweepSteps)
	case c.proto.Issuers < 1 || c.proto.Issuers > 1024:
		return fmt.Errorf("-issuers %d, want in [1, 1024]", c.proto.Issuers)
	case c.proto.QueryLanes < 1 || c.proto.QueryLanes > 1024:
		return fmt.Errorf("-query-lanes %d, want in [1, 1024]", c.proto.QueryLanes)
	case c.repeat < 1 || c.repeat > 100:
		return fmt.Errorf("-repeat %d, want in [1, 100]", c.repeat)
	case c.trials < 0 || c.trials > 100:
		return fmt.Errorf("-trials %d, want in [0, 100]", c.trials)
	case c.trials > 0 && !c.sustained:
		return fmt.Errorf("-trials %d confirms a sustained point: it needs -sustained", c.trials)
	}
	return nil
}

// parse parses the flags of a command that builds or reads a corpus.
func (c *indexerConfig) parse(fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) { c.windowSet = c.windowSet || f.Name == "duration" })
	return c.validate(fs)
}

func runIndexer(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("indexer", stderr)
	var c indexerConfig
	c.register(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if err := c.validateRun(); err != nil {
		return err
	}
	impls, err := parseImpls(c.compare, c.lanes)
	if err != nil {
		return err
	}
	intr, release := watch(stop)
	defer release()
	if c.sustained {
		return runSustained(args, c.window, c.trials, c.out, stdout, stderr, intr)
	}
	if c.repeat > 1 {
		return runRepeated(args, c.repeat, c.out, stdout, stderr, intr)
	}
	prof, err := createProfiles(c.cpuprofile, c.memprofile)
	if err != nil {
		return err
	}
	defer prof.close()
	progress := c.progress(stderr)
	cp, err := c.buildCorpus(progress)
	if err != nil {
		return err
	}
	if c.sized {
		for i := range impls {
			if impls[i].Name == "compressed" {
				impls[i].Blocks = int(cp.LogicalWorkers) * c.corpus.Blocks
			}
		}
	}
	if c.churn {
		return runChurn(stdout, cp, impls, c.window, c.out.format == "json", intr, progress)
	}
	stopProfile, err := prof.cpu.startCPU()
	if err != nil {
		return err
	}
	var results []*openloop.Result
	for _, im := range impls {
		if r := c.measure(cp, im, intr, progress); r != nil {
			results = append(results, r)
		}
		if intr.Load() {
			break
		}
	}
	stopProfile()
	if err := prof.mem.writeHeap(); err != nil {
		return err
	}
	prov := openloop.NewProvenance(c.corpus, c.corpusFile)
	for _, r := range results {
		r.Provenance = prov
	}
	if err := writeLines(c.out, stdout, results, func() { printIndexer(stdout, &c, cp, results) }, func() { printIndexerBench(stdout, results) }); err != nil {
		return err
	}
	if intr.Load() {
		return errInterrupted
	}
	return nil
}

// progress is where progress lines go: stderr, unless -quiet.
func (c *indexerConfig) progress(stderr io.Writer) io.Writer {
	if c.quiet {
		return io.Discard
	}
	return stderr
}

// buildCorpus loads the trace and builds the corpus, outside timing (or
// reads the -corpus file, its deadlines rescaled to -duration if given).
func (c *indexerConfig) buildCorpus(progress io.Writer) (*openloop.Corpus, error) {
	if c.corpusFile != "" {
		cp, err := openloop.ReadFile(c.corpusFile)
		if err != nil {
			return nil, err
		}
		if cp.ReferenceWindow <= 0 {
			return nil, fmt.Errorf("%s: a reference window of %v: the deadlines cannot be scaled", c.corpusFile, cp.ReferenceWindow)
		}
		if c.windowSet {
			cp = cp.Rescaled(c.window)
		}
		c.window, c.corpus.BlockSize, c.corpus.Trace = cp.ReferenceWindow, int(cp.BlockSize), c.corpusFile
		c.corpus.Dup, c.corpus.LengthFactor, c.corpus.Workers = int(cp.TraceDuplication), int(cp.TraceLength), int(cp.LogicalWorkers)
		t := cp.Totals()
		fmt.Fprintf(progress, "corpus %s: %d requests, %d events, %d block ops, window %v\n",
			c.corpusFile, t.Requests, t.StoredEvents+t.RemovedEvents+t.ClearedEvents, t.BlockOps(), cp.ReferenceWindow)
		return cp, nil
	}
	reqs, name, err := c.work.load()
	if err != nil {
		return nil, err
	}
	c.corpus.Trace = name
	fmt.Fprintf(progress, "building the corpus: %d requests over %d engines x %d copies...\n", len(reqs), c.corpus.Workers, c.corpus.Dup)
	cp, err := openloop.Build(reqs, c.corpus, c.window)
	if err != nil {
		return nil, err
	}
	t := cp.Totals()
	fmt.Fprintf(progress, "corpus: %d requests, %d stored, %d removed, %d cleared, %d logical ops, %d block ops\n",
		t.Requests, t.StoredEvents, t.RemovedEvents, t.ClearedEvents, t.LogicalOps(), t.BlockOps())
	return cp, nil
}

// measure runs one indexer: once, or the sweep (nil if it ran nothing).
func (c *indexerConfig) measure(cp *openloop.Corpus, im shardpool.Impl, intr *interrupt, progress io.Writer) *openloop.Result {
	if c.sweep {
		return openloop.Sweep(cp, im, c.proto, c.sweepSteps, intr.C(), func(w time.Duration, r *openloop.Result) {
			fmt.Fprintf(progress, "%s sweep: window %v, offered %.3gM block-ops/s, achieved %.3gM, kept up %v, generator valid %v\n",
				im, w, r.OfferedBlockOpsPerSec/1e6, r.AchievedBlockOpsPerSec/1e6, r.KeptUp, r.GeneratorValid)
		})
	}
	r := openloop.RunFresh(cp, im, c.proto, intr.C())
	fmt.Fprintf(progress, "%s: window %v, elapsed %.3fs, %.3gM block-ops/s, kept up %v, generator valid %v\n",
		im, c.window, float64(r.ElapsedNs)/1e9, r.AchievedBlockOpsPerSec/1e6, r.KeptUp, r.GeneratorValid)
	return r
}

// runChurn runs the soak for each indexer and prints the passes; a
// growing heap is an error.
func runChurn(stdout io.Writer, cp *openloop.Corpus, impls []shardpool.Impl, window time.Duration, asJSON bool, stopped *interrupt, progress io.Writer) error {
	var results []churnResult
	for _, im := range impls {
		results = append(results, churnSoak(cp, im, window, stopped, progress))
		if stopped.Load() {
			break
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"churn": results}); err != nil {
			return err
		}
	} else {
		printChurn(stdout, results)
	}
	if stopped.Load() {
		return errInterrupted
	}
	for _, r := range results {
		if r.Verdict != "flat" {
			return fmt.Errorf("%v: heap %s under churn", shardpool.Impl{Name: r.Impl, Lanes: r.Lanes}, r.Verdict)
		}
	}
	return nil
}

func printIndexer(w io.Writer, c *indexerConfig, cp *openloop.Corpus, results []*openloop.Result) {
	b, t := c.corpus, cp.Totals()
	fmt.Fprintf(w, "trace: %s; %d engines x %d copies, blocks of %d tokens, %d tokens per trace hash id, length factor %d\n",
		b.Trace, b.Workers, b.Dup, b.BlockSize, b.TraceBlockSize, b.LengthFactor)
	fmt.Fprintf(w, "corpus: %d requests, %d events, %d block ops; %d issuers, %d query lanes\n",
		t.Requests, t.StoredEvents+t.RemovedEvents+t.ClearedEvents, t.BlockOps(), c.proto.Issuers, c.proto.QueryLanes)
	fmt.Fprintln(w, "kept up: the replay and its drain ended within 1.10 x the window; valid: every operation issued within 1.01 x the window, in order, and applied without error")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "index\twindow s\telapsed s\tblock-ops/s\tper lane CPU-s\tkept up\tvalid\tharness CPU\tstolen\tlookup p50 µs\tp99 µs\twait p99 µs\tupdate p99 µs\tissue lag p99 µs\tdrain ms\tB/pair\t")
	for _, r := range results {
		kept := yesNo(r.KeptUp)
		if r.Interrupted {
			kept = "interrupted"
		}
		fmt.Fprintf(tw, "%s\t%.3g\t%.3f\t%.3gM\t%.3gM\t%s\t%s\t%.1f%%\t%.1f%%\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t\n",
			shardpool.Impl{Name: r.Index, Lanes: r.Lanes}, float64(r.BenchmarkDurationMs)/1e3, float64(r.ElapsedNs)/1e9,
			r.AchievedBlockOpsPerSec/1e6, r.AchievedBlockOpsPerLaneCPU/1e6, kept, yesNo(r.GeneratorValid), 100*r.IssuerCPUFraction, 100*r.HostStealFraction,
			us(r.QueryService.P50), us(r.QueryService.P99), us(r.QueryQueueWait.P99), us(r.UpdateAcceptedToFinished.P99),
			us(max(r.ReadIssueLag.P99, r.UpdateIssueLag.P99)), float64(r.DrainNs)/1e6, r.BytesPerPair)
	}
	tw.Flush()
}

func us(ns uint64) float64 { return float64(ns) / 1e3 }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

// printIndexerBench prints Go benchmark lines, so benchstat compares runs.
func printIndexerBench(w io.Writer, results []*openloop.Result) {
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: github.com/kvradix/kvradix/cmd/loadgen\n", runtime.GOOS, runtime.GOARCH)
	for _, r := range results {
		fmt.Fprintf(w, "BenchmarkIndexer/%s 1 %d ns/op %.0f block-ops/s %.0f block-ops/lane-cpu-s %d lookup-p50-ns %d lookup-p99-ns %d update-p99-ns %d drain-ns %.1f B/pair %.2f host-steal-%% %.2f host-other-%%\n",
			shardpool.Impl{Name: r.Index, Lanes: r.Lanes}, r.ElapsedNs, r.AchievedBlockOpsPerSec, r.AchievedBlockOpsPerLaneCPU,
			r.QueryService.P50, r.QueryService.P99, r.UpdateAcceptedToFinished.P99, r.DrainNs, r.BytesPerPair, 100*r.HostStealFraction, 100*r.HostOtherFraction)
	}
}
