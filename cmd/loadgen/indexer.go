package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvradix/kvradix/internal/stats"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/replay"
	"github.com/kvradix/kvradix/shardpool"
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
	DurationS        float64   `json:"duration_s"`
	ElapsedS         float64   `json:"elapsed_s"`
	Ops              int       `json:"ops"`
	Events           int       `json:"events"`
	Matches          int       `json:"matches"`
	OfferedOpsS      float64   `json:"offered_ops_s"`
	AchievedOpsS     float64   `json:"achieved_ops_s"`
	AchievedBlockOpS float64   `json:"achieved_block_ops_s"`
	FindMatchesUs    Latencies `json:"find_matches_us"`
	EventsQueuedFrac float64   `json:"events_queued_frac"`
	BytesPerPair     float64   `json:"bytes_per_pair"`
	Pairs            int       `json:"pairs"`
	Rejected         uint64    `json:"rejected_events"`
	Saturated        bool      `json:"saturated"`
	Interrupted      bool      `json:"interrupted,omitempty"`
	ThresholdOpsS    float64   `json:"threshold_ops_s,omitempty"`
	ThresholdP99Us   float64   `json:"threshold_p99_us,omitempty"`
	Sweep            []sweepPt `json:"sweep,omitempty"`
}

type sweepPt struct {
	OfferedOpsS       float64 `json:"offered_ops_s"`
	AchievedOpsS      float64 `json:"achieved_ops_s"`
	OfferedBlockOpsS  float64 `json:"offered_block_ops_s"`
	AchievedBlockOpsS float64 `json:"achieved_block_ops_s"`
	P99Us             float64 `json:"p99_us"`
	QueuedFrac        float64 `json:"events_queued_frac"`
	Saturated         bool    `json:"saturated"`
}

type indexerReport struct {
	Trace     string          `json:"trace"`
	Workers   int             `json:"workers"`
	Dup       int             `json:"dup"`
	BlockSize int             `json:"block_size"`
	Results   []indexerResult `json:"results"`
}

func runIndexer(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("indexer", stderr)
	var wf workloadFlags
	wf.register(fs)
	cfg := replay.DefaultConfig()
	cfg.Workers = 1000
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "simulated workers the trace is spread over")
	fs.IntVar(&cfg.Blocks, "blocks", cfg.Blocks, "KV blocks per simulated worker")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the request-to-worker spread")
	fs.Float64Var(&cfg.Speedup, "speedup", 1, "divide the trace's arrival times by this before building events")
	dup := fs.Int("dup", 1, "replay this many copies of the workload, in disjoint hash spaces")
	duration := fs.Duration("duration", 30*time.Second, "compress the timeline into this window (at most 10m)")
	compare := fs.String("compare", "single,pool,compressed", "indexes to compare: single, pool (over ConcurrentTree), compressed (pool over CompressedTree)")
	lanes := fs.String("lanes", "2", "pool lanes; a comma list runs one pool per value")
	producers := fs.Int("producers", 0, "goroutines replaying the timeline (0: one per simulated worker)")
	sweep := fs.Bool("sweep", false, "raise the offered rate (halving the window) until each index saturates")
	sweepSteps := fs.Int("sweep-steps", 6, "most sweep steps")
	asJSON := fs.Bool("json", false, "print one JSON object")
	format := fs.String("format", "table", "output: table, or bench (Go benchmark lines for benchstat)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile to `file`")
	memprofile := fs.String("memprofile", "", "write a heap profile to `file` at the end")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	churn := fs.Bool("churn", false, "soak: replay in passes for -duration while workers leave and rejoin; heap each second and after each pass, verdict flat or growing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("indexer: unexpected argument %q", fs.Arg(0))
	case *dup < 1:
		return fmt.Errorf("-dup %d, want >= 1", *dup)
	case *duration <= 0 || *duration > maxDuration:
		return fmt.Errorf("-duration %v, want in (0, %v]", *duration, maxDuration)
	case *producers < 0:
		return fmt.Errorf("-producers %d, want >= 0", *producers)
	case *format != "table" && *format != "bench":
		return fmt.Errorf("-format %q, want table or bench", *format)
	case *sweepSteps < 1:
		return fmt.Errorf("-sweep-steps %d, want >= 1", *sweepSteps)
	}
	impls, err := parseImpls(*compare, *lanes)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	reqs, name, err := wf.load()
	if err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	progress := stderr
	if *quiet {
		progress = io.Discard
	}
	fmt.Fprintf(progress, "building the workload: %d requests over %d workers...\n", len(reqs), cfg.Workers)
	ops, err := replay.Workload(reqs, cfg)
	if err != nil {
		return err
	}
	ops = duplicate(ops, *dup, cfg.Workers)
	w := newTimeline(ops, *producers, cfg.Workers*(*dup))
	fmt.Fprintf(progress, "workload: %d ops (%d events, %d matches), %d block ops, over %.0f s of trace time\n",
		len(ops), w.events, w.matches, w.blocks, w.span/1000)

	rep := indexerReport{Trace: name, Workers: cfg.Workers, Dup: *dup, BlockSize: cfg.BlockSize}
	stopped, release := watch(stop)
	defer release()
	if *churn {
		return runChurn(stdout, w, impls, cfg.BlockSize, cfg.Workers*(*dup), *duration, *asJSON, stopped, progress)
	}
	for _, im := range impls {
		var res indexerResult
		if *sweep {
			res = sweepIndex(w, im, cfg.BlockSize, *duration, *sweepSteps, stopped, progress)
		} else {
			res = w.run(im, cfg.BlockSize, *duration, stopped, progress)
		}
		rep.Results = append(rep.Results, res)
		if stopped.Load() {
			break
		}
	}
	if *memprofile != "" {
		f, err := os.Create(*memprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		runtime.GC()
		if err := pprof.WriteHeapProfile(f); err != nil {
			return err
		}
	}
	switch {
	case *asJSON:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case *format == "bench":
		printIndexerBench(stdout, rep)
	default:
		printIndexer(stdout, rep)
	}
	if stopped.Load() {
		return errors.New("interrupted: the results above are partial")
	}
	return nil
}

// runChurn runs the soak for each indexer and prints the passes; a
// growing heap is an error.
func runChurn(stdout io.Writer, w *timeline, impls []shardpool.Impl, blockSize, workers int, window time.Duration, asJSON bool, stopped *atomic.Bool, progress io.Writer) error {
	var results []churnResult
	for _, im := range impls {
		results = append(results, churnSoak(w, im, blockSize, workers, window, stopped, progress))
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
		return errors.New("interrupted: the results above are partial")
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

// timeline is a workload split among producer goroutines: each simulated
// worker's events stay on one producer, in order.
type timeline struct {
	ops                     []replay.Op
	parts                   [][]int32 // op indices per producer
	events, matches, blocks int
	span                    float64 // ms of trace time
}

func newTimeline(ops []replay.Op, producers, workers int) *timeline {
	if producers == 0 {
		producers = workers
	}
	t := &timeline{ops: ops, parts: make([][]int32, producers)}
	for i := range ops {
		op := &ops[i]
		p := int(uint64(op.Worker) % uint64(producers))
		t.parts[p] = append(t.parts[p], int32(i))
		if op.Match != nil {
			t.matches++
		} else {
			t.events++
		}
		t.blocks += op.Blocks()
		t.span = max(t.span, op.T)
	}
	return t
}

// run replays the timeline once, compressed into window, against a fresh
// index.
func (t *timeline) run(im shardpool.Impl, blockSize int, window time.Duration, stopped *atomic.Bool, progress io.Writer) indexerResult {
	lat := make([][]time.Duration, len(t.parts))
	for p, part := range t.parts {
		lat[p] = make([]time.Duration, 0, len(part)/8+1)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	idx := im.New(blockSize)
	defer idx.Close()
	scale := 0.0
	if t.span > 0 {
		scale = float64(window) / t.span // ns of wall time per ms of trace time
	}
	var done, submitted atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for p, part := range t.parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range part {
				if stopped.Load() {
					return
				}
				op := &t.ops[i]
				if d := time.Until(start.Add(time.Duration(op.T * scale))); d > time.Millisecond {
					time.Sleep(d)
				}
				if op.Match != nil {
					t0 := time.Now()
					if _, err := idx.FindMatches(op.Match); err != nil {
						return
					}
					lat[p] = append(lat[p], time.Since(t0))
				} else {
					if idx.ApplyEvent(kvevent.RouterEvent{WorkerID: op.Worker, Event: op.Event}) != nil {
						return
					}
					submitted.Add(1)
				}
				done.Add(1)
			}
		}()
	}
	// Progress once a second; sample the queue when the window ends.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	windowEnd := time.NewTimer(window)
	defer windowEnd.Stop()
	queuedFrac, sampled := 0.0, false
	sample := func() {
		st := idx.Stats()
		processed := st.Applied + st.Rejected()
		queuedFrac = 1 - float64(processed)/float64(max(t.events, 1))
		sampled = true
	}
	last, lastDone := start, int64(0)
wait:
	for {
		select {
		case <-finished:
			break wait
		case <-windowEnd.C:
			sample()
		case now := <-tick.C:
			d := done.Load()
			fmt.Fprintf(progress, "%s: %5.1fs %9.0f ops/s, queue depth %d\n", im, now.Sub(start).Seconds(),
				float64(d-lastDone)/now.Sub(last).Seconds(), idx.Stats().QueueDepth)
			last, lastDone = now, d
		}
	}
	_, _ = idx.Flush()
	elapsed := time.Since(start)
	if !sampled {
		// Finished early: whatever is queued at the end of the window is
		// what the flush found still to apply.
		queuedFrac = 0
		if elapsed > window {
			sample()
		}
	}
	st := idx.Stats()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	r := indexerResult{
		Impl: im.Name, Lanes: im.Lanes, DurationS: window.Seconds(), ElapsedS: elapsed.Seconds(),
		Ops: len(t.ops), Events: t.events, Matches: t.matches,
		OfferedOpsS:      float64(len(t.ops)) / window.Seconds(),
		AchievedOpsS:     float64(done.Load()) / max(elapsed, window).Seconds(),
		AchievedBlockOpS: float64(t.blocks) * float64(done.Load()) / float64(max(len(t.ops), 1)) / max(elapsed, window).Seconds(),
		FindMatchesUs:    latencies(lat...),
		EventsQueuedFrac: queuedFrac,
		Pairs:            st.Pairs,
		Rejected:         st.Rejected(),
		Interrupted:      stopped.Load(),
	}
	if st.Pairs > 0 {
		r.BytesPerPair = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(st.Pairs)
	}
	r.Saturated = r.AchievedOpsS < 0.95*r.OfferedOpsS || r.EventsQueuedFrac > 0.05
	return r
}

// sweepIndex halves the window (doubling the offered rate) until the index
// saturates, and reports the last unsaturated step as the threshold.
func sweepIndex(t *timeline, im shardpool.Impl, blockSize int, window time.Duration, steps int, stopped *atomic.Bool, progress io.Writer) indexerResult {
	var best, last indexerResult
	var pts []sweepPt
	for k := range steps {
		w := window >> k
		if w < 100*time.Millisecond || stopped.Load() {
			break
		}
		last = t.run(im, blockSize, w, stopped, progress)
		pts = append(pts, sweepPt{OfferedOpsS: last.OfferedOpsS, AchievedOpsS: last.AchievedOpsS,
			OfferedBlockOpsS: float64(t.blocks) / w.Seconds(), AchievedBlockOpsS: last.AchievedBlockOpS,
			P99Us: last.FindMatchesUs.P99, QueuedFrac: last.EventsQueuedFrac, Saturated: last.Saturated})
		fmt.Fprintf(progress, "%s sweep: offered %.0f ops/s, achieved %.0f, saturated %v\n", im, last.OfferedOpsS, last.AchievedOpsS, last.Saturated)
		if last.Saturated {
			break
		}
		best = last
	}
	res := last
	if best.Impl != "" {
		res = best
		res.ThresholdOpsS = best.AchievedOpsS
		res.ThresholdP99Us = best.FindMatchesUs.P99
	}
	res.Sweep = pts
	return res
}

func printIndexer(w io.Writer, rep indexerReport) {
	fmt.Fprintf(w, "trace: %s; %d simulated workers x %d copies; block size %d\n\n", rep.Trace, rep.Workers, rep.Dup, rep.BlockSize)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "index\toffered ops/s\tachieved ops/s\tblock-ops/s\tmatch p50 µs\tp99 µs\tp99.9 µs\tqueued\tB/pair\tthreshold ops/s\tverdict\t")
	for _, r := range rep.Results {
		verdict := "ok"
		if r.Saturated {
			verdict = "SATURATED"
		}
		if r.Interrupted {
			verdict += " (interrupted)"
		}
		threshold := "-"
		if r.ThresholdOpsS > 0 {
			threshold = fmt.Sprintf("%.0f", r.ThresholdOpsS)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f%%\t%.0f\t%s\t%s\t\n",
			shardpool.Impl{Name: r.Impl, Lanes: r.Lanes}, r.OfferedOpsS, r.AchievedOpsS, r.AchievedBlockOpS,
			r.FindMatchesUs.P50, r.FindMatchesUs.P99, r.FindMatchesUs.P999, 100*r.EventsQueuedFrac, r.BytesPerPair, threshold, verdict)
	}
	tw.Flush()
}

// printIndexerBench prints Go benchmark lines, so benchstat compares runs.
func printIndexerBench(w io.Writer, rep indexerReport) {
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: github.com/kvradix/kvradix/cmd/loadgen\n", runtime.GOOS, runtime.GOARCH)
	for _, r := range rep.Results {
		fmt.Fprintf(w, "BenchmarkIndexer/%s 1 %.0f ns/op %.0f p50-ns %.0f p99-ns %.0f p999-ns %.0f ops/s %.0f blocks/s %.1f B/pair",
			shardpool.Impl{Name: r.Impl, Lanes: r.Lanes}, r.ElapsedS*1e9, r.FindMatchesUs.P50*1e3, r.FindMatchesUs.P99*1e3, r.FindMatchesUs.P999*1e3,
			r.AchievedOpsS, r.AchievedBlockOpS, r.BytesPerPair)
		if r.ThresholdOpsS > 0 {
			fmt.Fprintf(w, " %.0f threshold-ops/s", r.ThresholdOpsS)
		}
		fmt.Fprintln(w)
	}
}
