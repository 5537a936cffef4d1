package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/kvradix/kvradix/internal/stats"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/openloop"
	"github.com/kvradix/kvradix/replay"
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

type indexerResult struct {
	Impl             string    `json:"impl"`
	Lanes            int       `json:"lanes"`
	DurationS        float64   `json:"duration_s"` // the window
	ElapsedS         float64   `json:"elapsed_s"`  // first deadline to the last completion, drain included
	Ops              int       `json:"ops"`
	Events           int       `json:"events"`
	Matches          int       `json:"matches"`
	LogicalOps       int       `json:"logical_ops"` // requests + Stored + Removed + Cleared
	BlockOps         int64     `json:"block_ops"`   // request hashes + Stored and Removed hashes
	OfferedOpsS      float64   `json:"offered_ops_s"`
	AchievedOpsS     float64   `json:"achieved_ops_s"`
	OfferedBlockOpsS float64   `json:"offered_block_ops_s"`
	AchievedBlockOpS float64   `json:"achieved_block_ops_s"` // drain-inclusive
	GeneratorValid   bool      `json:"generator_valid"`      // all issued within 1.01 x window, in order, every op succeeded
	KeptUp           bool      `json:"kept_up"`              // replay + drain within 1.10 x window
	FindMatchesUs    Latencies `json:"find_matches_us"`      // = query_service_us
	QueryServiceUs   Latencies `json:"query_service_us"`
	QueryWaitUs      Latencies `json:"query_wait_us"`
	UpdateLatencyUs  Latencies `json:"update_latency_us"` // event accepted to applied
	IssueLagUs       Latencies `json:"issue_lag_us"`
	DrainMs          float64   `json:"drain_ms"` // issuers done to the last completion
	// HarnessCPUFrac is the CPU the issuers and the event feeders used
	// (their threads' clocks), over the run's elapsed time × GOMAXPROCS:
	// the share of the machine the harness took from the index.
	HarnessCPUFrac float64 `json:"issuer_cpu_fraction"`
	// LaneCPUNs is the CPU the index used during the run: the process's,
	// less the harness's (lanes, lookups, and the collector working for
	// them); BlockOpsPerLaneCPU, the block operations over it, is what the
	// field calls block-ops/s per lane core.
	LaneCPUNs          int64   `json:"lane_cpu_ns"`
	BlockOpsPerLaneCPU float64 `json:"achieved_block_ops_per_lane_cpu_sec"`

	v4               *openloop.Result // the run in Dynamo's result JSON (-format v4)
	QueueDepthAtStop int              `json:"queue_depth_at_stop"` // events and queries queued when the issuers stopped
	EventsQueuedFrac float64          `json:"events_queued_frac"`  // of all events, those still queued then
	BytesPerPair     float64          `json:"bytes_per_pair"`
	Pairs            int              `json:"pairs"`
	Rejected         uint64           `json:"rejected_events"`
	Saturated        bool             `json:"saturated"` // = !kept_up
	Interrupted      bool             `json:"interrupted,omitempty"`
	ThresholdOpsS    float64          `json:"threshold_ops_s,omitempty"`
	ThresholdP99Us   float64          `json:"threshold_p99_us,omitempty"`
	Sweep            []sweepPt        `json:"sweep,omitempty"`
}

// setLaneCPU records the index's CPU time and the block operations per
// second of it.
func (r *indexerResult) setLaneCPU(ns int64) {
	if ns <= 0 {
		return
	}
	r.LaneCPUNs = ns
	r.BlockOpsPerLaneCPU = float64(r.BlockOps) / (float64(ns) / 1e9)
	if r.v4 != nil {
		r.v4.LaneCPUNs, r.v4.AchievedBlockOpsPerLaneCPU = r.LaneCPUNs, r.BlockOpsPerLaneCPU
	}
}

type sweepPt struct {
	WindowMs          float64 `json:"window_ms"`
	OfferedOpsS       float64 `json:"offered_ops_s"`
	AchievedOpsS      float64 `json:"achieved_ops_s"`
	OfferedBlockOpsS  float64 `json:"offered_block_ops_s"`
	AchievedBlockOpsS float64 `json:"achieved_block_ops_s"`
	P99Us             float64 `json:"p99_us"`
	Saturated         bool    `json:"saturated"`
}

type indexerReport struct {
	Command  string          `json:"command"`
	Corpus   corpusConfig    `json:"corpus"`
	Protocol protocol        `json:"protocol"`
	Requests int             `json:"requests"`
	Events   int             `json:"events"`
	BlockOps int64           `json:"block_ops"`
	Results  []indexerResult `json:"results"`
	// Kept from before the protocol, for readers of older files.
	Trace     string `json:"trace"`
	Workers   int    `json:"workers"`
	Dup       int    `json:"dup"`
	BlockSize int    `json:"block_size"`
}

// indexerConfig is what `loadgen indexer` was asked to do.
type indexerConfig struct {
	work       workloadFlags
	corpus     corpusConfig
	proto      protocol
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
}

func (c *indexerConfig) register(fs *flag.FlagSet) {
	c.work.register(fs)
	c.corpus = corpusConfig{Workers: 128, BlockSize: 128, TraceBlockSize: trace.TraceBlockSize, Blocks: 16384, Dup: 1, LengthFactor: 1}
	fs.IntVar(&c.corpus.Workers, "workers", c.corpus.Workers, "simulated engines the trace is spread over (Dynamo: 128)")
	fs.IntVar(&c.corpus.Blocks, "blocks", c.corpus.Blocks, "KV blocks per engine")
	fs.IntVar(&c.corpus.BlockSize, "block-size", c.corpus.BlockSize, "tokens per KV block (Dynamo: 128)")
	fs.IntVar(&c.corpus.TraceBlockSize, "trace-block-size", c.corpus.TraceBlockSize, "tokens per trace hash id (Dynamo: 512)")
	fs.IntVar(&c.corpus.Dup, "dup", c.corpus.Dup, "copies of the trace in disjoint hash spaces, each on its own workers (Dynamo: 20)")
	fs.IntVar(&c.corpus.LengthFactor, "length-factor", c.corpus.LengthFactor, "stretch every request's hash ids this many times (Dynamo: 4)")
	fs.Uint64Var(&c.corpus.Seed, "seed", 0, "seed of the request-to-engine spread")
	c.proto = protocol{Issuers: 2, QueryLanes: runtime.GOMAXPROCS(0)}
	fs.IntVar(&c.proto.Issuers, "issuers", c.proto.Issuers, "goroutines issuing operations by deadline")
	fs.IntVar(&c.proto.QueryLanes, "query-lanes", c.proto.QueryLanes, "goroutines running lookups (Dynamo: 128)")
	fs.DurationVar(&c.window, "duration", 20*time.Second, "the window every worker's timeline is rescaled to (at most 10m)")
	fs.StringVar(&c.compare, "compare", "single,pool,compressed", "indexers: single, pool (over ConcurrentTree), compressed (pool over CompressedTree)")
	fs.StringVar(&c.lanes, "lanes", "2", "pool lanes; a comma list runs one pool per value")
	fs.BoolVar(&c.sweep, "sweep", false, "find the shortest window that keeps up: halve -duration, then bisect")
	fs.IntVar(&c.sweepSteps, "sweep-steps", 6, "most sweep steps")
	fs.IntVar(&c.repeat, "repeat", 1, "run this many fresh processes and report the median and spread")
	fs.BoolVar(&c.churn, "churn", false, "soak: replay in passes for -duration while workers leave and rejoin; heap each second and after each pass, verdict flat or growing")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines on stderr")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile to `file`")
	fs.StringVar(&c.memprofile, "memprofile", "", "write a heap profile to `file` at the end")
	fs.BoolVar(&c.sustained, "sustained", false, "find the sustained rate: each point in 3 fresh processes, all kept up at >= 99% of offered; the window halves from -duration, then bisects to 10% (one indexer: -compare and -lanes)")
	fs.StringVar(&c.corpusFile, "corpus", "", "replay this SMGMCK01 corpus (loadgen corpus writes one) instead of building one from the trace; its deadlines are rescaled to -duration if given")
	c.out.register(fs)
}

func (c *indexerConfig) validate() error {
	switch {
	case c.window <= 0 || c.window > maxDuration:
		return fmt.Errorf("-duration %v, want in (0, %v]", c.window, maxDuration)
	case c.sweepSteps < 1:
		return fmt.Errorf("-sweep-steps %d, want >= 1", c.sweepSteps)
	case c.proto.Issuers < 1 || c.proto.Issuers > 1024:
		return fmt.Errorf("-issuers %d, want in [1, 1024]", c.proto.Issuers)
	case c.proto.QueryLanes < 1 || c.proto.QueryLanes > 1024:
		return fmt.Errorf("-query-lanes %d, want in [1, 1024]", c.proto.QueryLanes)
	case c.repeat < 1 || c.repeat > 100:
		return fmt.Errorf("-repeat %d, want in [1, 100]", c.repeat)
	}
	return errors.Join(c.corpus.validate(), c.out.validate())
}

func runIndexer(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("indexer", stderr)
	var c indexerConfig
	c.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("indexer: unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { c.windowSet = c.windowSet || f.Name == "duration" })
	if err := c.validate(); err != nil {
		return err
	}
	impls, err := parseImpls(c.compare, c.lanes)
	if err != nil {
		return err
	}
	intr, release := watch(stop)
	defer release()
	if c.sustained {
		return runSustained(args, c.window, c.out, stdout, stderr, intr)
	}
	if c.repeat > 1 {
		return runRepeated(args, c.repeat, c.out, stdout, stderr, intr)
	}
	progress := c.progress(stderr)
	cp, err := c.buildCorpus(progress)
	if err != nil {
		return err
	}
	if c.churn {
		return runChurn(stdout, cp, impls, c.window, c.out.format == "json", intr, progress)
	}
	stopProfile, err := startCPUProfile(c.cpuprofile)
	if err != nil {
		return err
	}
	rep := c.report(args, cp)
	for _, im := range impls {
		rep.Results = append(rep.Results, c.measure(cp, im, intr, progress))
		if intr.Load() {
			break
		}
	}
	stopProfile()
	if err := writeHeapProfile(c.memprofile); err != nil {
		return err
	}
	if c.out.format == "v4" {
		if err := writeV4(stdout, rep, c.provenance()); err != nil {
			return err
		}
	} else if err := c.out.write(stdout, rep, func() { printIndexer(stdout, rep) }, func() { printIndexerBench(stdout, rep) }); err != nil {
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
// reads the -corpus file).
func (c *indexerConfig) buildCorpus(progress io.Writer) (*corpus, error) {
	if c.corpusFile != "" {
		window := time.Duration(0)
		if c.windowSet {
			window = c.window
		}
		cp, err := loadCorpus(c.corpusFile, window)
		if err != nil {
			return nil, err
		}
		c.window, c.corpus.BlockSize, c.corpus.Trace = cp.window, cp.cfg.BlockSize, c.corpusFile
		c.corpus.Dup, c.corpus.LengthFactor, c.corpus.Workers = cp.cfg.Dup, cp.cfg.LengthFactor, cp.workers
		fmt.Fprintf(progress, "corpus %s: %d requests, %d events, %d block ops, window %v\n",
			c.corpusFile, cp.requests, len(cp.ops)-cp.requests, cp.blockOps, cp.window)
		return cp, nil
	}
	reqs, name, err := c.work.load()
	if err != nil {
		return nil, err
	}
	c.corpus.Trace = name
	fmt.Fprintf(progress, "building the corpus: %d requests over %d engines x %d copies...\n", len(reqs), c.corpus.Workers, c.corpus.Dup)
	cp, err := buildCorpus(reqs, c.corpus, c.window)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "corpus: %d requests, %d events (%d stored, %d removed, %d cleared), %d logical ops, %d block ops\n",
		cp.requests, len(cp.ops)-cp.requests, cp.stored, cp.removed, cp.cleared, cp.logicalOps(), cp.blockOps)
	return cp, nil
}

// report starts the report with its provenance.
func (c *indexerConfig) report(args []string, cp *corpus) indexerReport {
	return indexerReport{Command: commandLine("indexer", args), Corpus: c.corpus, Protocol: c.proto,
		Requests: cp.requests, Events: len(cp.ops) - cp.requests, BlockOps: cp.blockOps,
		Trace: c.corpus.Trace, Workers: c.corpus.Workers, Dup: c.corpus.Dup, BlockSize: c.corpus.BlockSize}
}

// measure runs one indexer: once, or the sweep.
func (c *indexerConfig) measure(cp *corpus, im shardpool.Impl, intr *interrupt, progress io.Writer) indexerResult {
	if c.sweep {
		return sweep(cp, im, c.proto, c.sweepSteps, intr.C(), progress)
	}
	r := cp.run(im, c.corpus.BlockSize, c.proto, intr.C())
	fmt.Fprintf(progress, "%s: window %v, elapsed %.3fs, %.3gM block-ops/s, kept up %v, generator valid %v\n",
		im, c.window, r.ElapsedS, r.AchievedBlockOpS/1e6, r.KeptUp, r.GeneratorValid)
	return r
}

// runChurn runs the soak for each indexer and prints the passes; a
// growing heap is an error.
func runChurn(stdout io.Writer, cp *corpus, impls []shardpool.Impl, window time.Duration, asJSON bool, stopped *interrupt, progress io.Writer) error {
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

// duplicate appends d-1 copies of ops in disjoint worker and hash spaces.
func duplicate(ops []replay.Op, d, workers int) []replay.Op {
	if d == 1 {
		return ops
	}
	out := make([]replay.Op, 0, len(ops)*d)
	for _, op := range ops {
		for k := range d {
			out = append(out, salted(op, k, workers))
		}
	}
	return out
}

// salted moves op into copy k: worker ids shift by k·workers, every hash is
// xor-ed with a per-copy salt.
func salted(op replay.Op, k, workers int) replay.Op {
	if k == 0 {
		return op
	}
	salt := bits.RotateLeft64(uint64(k)*0x9E3779B97F4A7C15, 17) | 1
	op.Worker += kvevent.WorkerID(k * workers)
	if op.Match != nil {
		m := make([]uint64, len(op.Match))
		for i, h := range op.Match {
			m[i] = h ^ salt
		}
		op.Match = m
		return op
	}
	switch d := op.Event.Data.(type) {
	case kvevent.Stored:
		s := kvevent.Stored{HasParent: d.HasParent, ParentHash: d.ParentHash ^ salt, Blocks: make([]kvevent.StoredBlock, len(d.Blocks))}
		for i, b := range d.Blocks {
			s.Blocks[i] = kvevent.StoredBlock{BlockHash: b.BlockHash ^ salt, TokensHash: b.TokensHash ^ salt}
		}
		op.Event.Data = s
	case kvevent.Removed:
		r := kvevent.Removed{BlockHashes: make([]uint64, len(d.BlockHashes))}
		for i, h := range d.BlockHashes {
			r.BlockHashes[i] = h ^ salt
		}
		op.Event.Data = r
	}
	return op
}

func printIndexer(w io.Writer, rep indexerReport) {
	c := rep.Corpus
	fmt.Fprintf(w, "trace: %s; %d engines x %d copies, blocks of %d tokens, %d tokens per trace hash id, length factor %d\n",
		c.Trace, c.Workers, c.Dup, c.BlockSize, c.TraceBlockSize, c.LengthFactor)
	fmt.Fprintf(w, "corpus: %d requests, %d events, %d block ops; %d issuers, %d query lanes\n\n",
		rep.Requests, rep.Events, rep.BlockOps, rep.Protocol.Issuers, rep.Protocol.QueryLanes)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "index\twindow s\telapsed s\tblock-ops/s\tkept up\tvalid\tlookup p50 µs\tp99 µs\twait p99 µs\tupdate p99 µs\tissue lag p99 µs\tdrain ms\tB/pair\t")
	for _, r := range rep.Results {
		kept := yesNo(r.KeptUp)
		if r.Interrupted {
			kept = "interrupted"
		}
		fmt.Fprintf(tw, "%s\t%.3g\t%.3f\t%.3gM\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t\n",
			shardpool.Impl{Name: r.Impl, Lanes: r.Lanes}, r.DurationS, r.ElapsedS, r.AchievedBlockOpS/1e6, kept, yesNo(r.GeneratorValid),
			r.QueryServiceUs.P50, r.QueryServiceUs.P99, r.QueryWaitUs.P99, r.UpdateLatencyUs.P99, r.IssueLagUs.P99, r.DrainMs, r.BytesPerPair)
	}
	tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

// printIndexerBench prints Go benchmark lines, so benchstat compares runs.
func printIndexerBench(w io.Writer, rep indexerReport) {
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: github.com/kvradix/kvradix/cmd/loadgen\n", runtime.GOOS, runtime.GOARCH)
	for _, r := range rep.Results {
		fmt.Fprintf(w, "BenchmarkIndexer/%s 1 %.0f ns/op %.0f block-ops/s %.0f lookup-p50-ns %.0f lookup-p99-ns %.0f update-p99-ns %.0f drain-ns %.1f B/pair\n",
			shardpool.Impl{Name: r.Impl, Lanes: r.Lanes}, r.ElapsedS*1e9, r.AchievedBlockOpS,
			r.QueryServiceUs.P50*1e3, r.QueryServiceUs.P99*1e3, r.UpdateLatencyUs.P99*1e3, r.DrainMs*1e6, r.BytesPerPair)
	}
}
