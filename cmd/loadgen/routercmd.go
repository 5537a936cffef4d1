package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/replay"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/trace"
)

type routerResult struct {
	Mode          string    `json:"mode"`
	Lanes         int       `json:"lanes"`
	Requests      int       `json:"requests"`
	OfferedRPS    float64   `json:"offered_rps"`
	AchievedRPS   float64   `json:"achieved_rps"`
	DecisionUs    Latencies `json:"decision_us"`
	Events        uint64    `json:"events"`
	Rejected      uint64    `json:"rejected_events"`
	ElapsedS      float64   `json:"elapsed_s"`
	Saturated     bool      `json:"saturated"`
	Interrupted   bool      `json:"interrupted,omitempty"`
	WorkerSpreadC float64   `json:"worker_spread_cv"`
}

// maxRate bounds -rate: one request a nanosecond, far past what any router
// path takes.
const maxRate = 1e9

// runRouter drives the full router path: each request is selected, its
// worker publishes the prompt's blocks, its first token is reported, and it
// completes once -inflight newer requests have started; requests arrive at
// an offered rate from a pool of clients.
func runRouter(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("router", stderr)
	var wf workloadFlags
	wf.register(fs)
	workers := fs.Int("workers", 64, "workers behind the router")
	blockSize := fs.Int("block-size", 64, "tokens per KV block")
	rate := fs.Float64("rate", 2000, "offered requests per second")
	duration := fs.Duration("duration", 10*time.Second, "how long to offer load (at most 10m)")
	clients := fs.Int("clients", 32, "concurrent client goroutines")
	inflight := fs.Int("inflight", 512, "requests kept active (first token seen, not complete) across clients")
	modes := fs.String("modes", "round_robin,kv", "router modes: round_robin, kv")
	lanes := fs.Int("lanes", 2, "indexer lanes of the kv router (1 = single-threaded)")
	dpSize := fs.Int("dp-size", 1, "data-parallel ranks per worker, scheduled apart")
	asJSON := fs.Bool("json", false, "print one JSON object")
	format := fs.String("format", "table", "output: table, or bench")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("router: unexpected argument %q", fs.Arg(0))
	case *workers < 1:
		return fmt.Errorf("-workers %d, want >= 1", *workers)
	case !(*rate > 0 && *rate <= maxRate):
		return fmt.Errorf("-rate %v, want in (0, %g] requests/s", *rate, maxRate)
	case *duration <= 0 || *duration > maxDuration:
		return fmt.Errorf("-duration %v, want in (0, %v]", *duration, maxDuration)
	case *rate*duration.Seconds() < 1:
		return fmt.Errorf("-rate %v over -duration %v offers no request", *rate, *duration)
	case *clients < 1:
		return fmt.Errorf("-clients %d, want >= 1", *clients)
	case *inflight < 0:
		return fmt.Errorf("-inflight %d, want >= 0", *inflight)
	case *format != "table" && *format != "bench":
		return fmt.Errorf("-format %q, want table or bench", *format)
	}
	var ms []router.Mode
	for _, m := range strings.Split(*modes, ",") {
		switch strings.TrimSpace(m) {
		case "round_robin":
			ms = append(ms, router.RoundRobin)
		case "kv":
			ms = append(ms, router.KV)
		default:
			return fmt.Errorf("-modes: unknown mode %q (want round_robin, kv)", m)
		}
	}
	reqs, _, err := wf.load()
	if err != nil {
		return err
	}
	if len(reqs) == 0 {
		return fmt.Errorf("the workload has no requests")
	}
	stopped, release := watch(stop)
	defer release()
	var results []routerResult
	for _, m := range ms {
		cfg := router.DefaultConfig()
		cfg.BlockSize, cfg.IndexerLanes, cfg.DPSize = *blockSize, *lanes, *dpSize
		r, err := router.New(m, cfg, *workers)
		if err != nil {
			return err
		}
		res, err := driveRouter(r, reqs, *rate, *duration, *clients, *inflight / *clients, *blockSize, stopped, stderr)
		_ = r.Shutdown()
		if err != nil {
			return err
		}
		results = append(results, res)
		if stopped.Load() {
			break
		}
	}
	switch {
	case *asJSON:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"workers": *workers, "results": results})
	case *format == "bench":
		fmt.Fprintln(stdout, "pkg: github.com/kvradix/kvradix/cmd/loadgen")
		for _, r := range results {
			fmt.Fprintf(stdout, "BenchmarkRouter/mode=%s/lanes=%d 1 %.0f ns/op %.0f p50-ns %.0f p99-ns %.0f p999-ns %.0f req/s\n",
				r.Mode, r.Lanes, r.ElapsedS*1e9, r.DecisionUs.P50*1e3, r.DecisionUs.P99*1e3, r.DecisionUs.P999*1e3, r.AchievedRPS)
		}
	default:
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "mode\tlanes\toffered req/s\tachieved req/s\tdecision p50 µs\tp99 µs\tp99.9 µs\tevents\trejected\tspread cv\tverdict\t")
		for _, r := range results {
			verdict := "ok"
			if r.Saturated {
				verdict = "SATURATED"
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%d\t%d\t%.3f\t%s\t\n", r.Mode, r.Lanes, r.OfferedRPS, r.AchievedRPS,
				r.DecisionUs.P50, r.DecisionUs.P99, r.DecisionUs.P999, r.Events, r.Rejected, r.WorkerSpreadC, verdict)
		}
		tw.Flush()
	}
	return nil
}

func driveRouter(r *router.Router, reqs []trace.Request, rate float64, window time.Duration, clients, keep, bs int, stopped *atomic.Bool, progress io.Writer) (routerResult, error) {
	n := int(rate * window.Seconds())
	res := routerResult{Mode: r.Mode().String(), Requests: n, OfferedRPS: rate}
	res.Lanes = r.Stats().IndexerLanes
	dp := r.DPSize()
	perWorker := make([]atomic.Int64, r.Workers()*dp)
	lat := make([][]time.Duration, clients)
	var next, done atomic.Int64
	var firstErr error
	var errOnce sync.Once
	fail := func(err error) { errOnce.Do(func() { firstErr = err; stopped.Store(true) }) }
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tokens []uint32
			var active []uuid.UUID // this client's requests still running
			defer func() {
				for _, id := range active {
					if _, err := r.OnComplete(id); err != nil {
						fail(err)
					}
				}
			}()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || stopped.Load() {
					return
				}
				if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > time.Millisecond {
					time.Sleep(d)
				}
				tr := reqs[i%len(reqs)]
				tokens = trace.Tokens(tokens[:0], tr)
				var id uuid.UUID
				binary.BigEndian.PutUint64(id[8:], uint64(i)+1)
				t0 := time.Now()
				w, err := r.SelectWorkerRank(context.Background(), router.Request{UUID: id, Tokens: tokens, MaxOutputTokens: tr.OutputLength})
				lat[c] = append(lat[c], time.Since(t0))
				if err != nil {
					fail(err)
					return
				}
				perWorker[int(w.ID)*dp+int(w.DPRank)].Add(1)
				// The worker caches the prompt's blocks...
				local := hashing.LocalHashes(nil, tokens, bs, hashing.Options{})
				seq := hashing.SequenceHashes(nil, local)
				st := kvevent.Stored{Blocks: make([]kvevent.StoredBlock, len(local))}
				for j := range local {
					st.Blocks[j] = kvevent.StoredBlock{BlockHash: seq[j], TokensHash: local[j]}
				}
				if err := r.Sink(w.ID).Publish(kvevent.Event{ID: uint64(i), DPRank: w.DPRank, Data: st}); err != nil {
					fail(err)
					return
				}
				// ...and serves it.
				if _, err := r.OnFirstToken(id); err != nil {
					fail(err)
					return
				}
				active = append(active, id)
				if len(active) > keep {
					if _, err := r.OnComplete(active[0]); err != nil {
						fail(err)
						return
					}
					active = active[1:]
				}
				done.Add(1)
			}
		}()
	}
	// One progress line a second until the clients are done.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	tick := time.NewTicker(time.Second)
	last, lastDone := start, int64(0)
progress:
	for {
		select {
		case <-finished:
			break progress
		case now := <-tick.C:
			d, depth := done.Load(), r.Stats().Index.QueueDepth
			fmt.Fprintf(progress, "%s: %5.1fs %8.0f req/s, queue depth %d\n", res.Mode, now.Sub(start).Seconds(),
				float64(d-lastDone)/now.Sub(last).Seconds(), depth)
			last, lastDone = now, d
		}
	}
	tick.Stop()
	if err := r.Flush(); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil && !stopped.Load() {
		return res, firstErr
	}
	elapsed := time.Since(start)
	res.ElapsedS = elapsed.Seconds()
	res.AchievedRPS = float64(done.Load()) / max(elapsed, window).Seconds()
	res.DecisionUs = latencies(lat...)
	st := r.Stats().Index
	res.Events, res.Rejected = st.Applied+st.Rejected(), st.Rejected()
	counts := make([]int, len(perWorker))
	for i := range perWorker {
		counts[i] = int(perWorker[i].Load())
	}
	res.WorkerSpreadC = replay.SpreadOf(counts).CV
	res.Saturated = res.AchievedRPS < 0.95*rate
	res.Interrupted = stopped.Load()
	fmt.Fprintf(progress, "%s: %d requests in %.1fs\n", res.Mode, done.Load(), elapsed.Seconds())
	return res, nil
}
