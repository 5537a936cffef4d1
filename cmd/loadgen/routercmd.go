package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
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

type routerReport struct {
	Command string         `json:"command"`
	Workers int            `json:"workers"`
	DPSize  int            `json:"dp_size"`
	Results []routerResult `json:"results"`
}

// maxRate bounds -rate: one request a nanosecond, far past what any router
// path takes.
const maxRate = 1e9

// routerConfig is what `loadgen router` was asked to do.
type routerConfig struct {
	work      workloadFlags
	out       output
	workers   int
	blockSize int
	rate      float64
	window    time.Duration
	clients   int
	inflight  int
	modes     string
	lanes     int
	dpSize    int
	capacity  int
}

func (c *routerConfig) register(fs *flag.FlagSet) {
	c.work.register(fs)
	c.out.register(fs)
	fs.IntVar(&c.workers, "workers", 64, "workers behind the router")
	fs.IntVar(&c.blockSize, "block-size", 64, "tokens per KV block")
	fs.Float64Var(&c.rate, "rate", 2000, "offered requests per second")
	fs.DurationVar(&c.window, "duration", 10*time.Second, "how long to offer load (at most 10m)")
	fs.IntVar(&c.clients, "clients", 32, "concurrent client goroutines")
	fs.IntVar(&c.inflight, "inflight", 512, "requests kept active (first token seen, not complete) across clients")
	fs.StringVar(&c.modes, "modes", "round_robin,kv", "router modes: round_robin, kv, kv_tiers, kv_approx_lru, kv_approx_ttl, kv_predict")
	fs.IntVar(&c.capacity, "approx-capacity", 16384, "kv_approx_lru's KV blocks per worker rank")
	fs.IntVar(&c.lanes, "lanes", 2, "indexer lanes of the kv router (1 = single-threaded)")
	fs.IntVar(&c.dpSize, "dp-size", 1, "data-parallel ranks per worker, scheduled apart")
}

func (c *routerConfig) validate() error {
	switch {
	case c.workers < 1:
		return fmt.Errorf("-workers %d, want >= 1", c.workers)
	case !(c.rate > 0 && c.rate <= maxRate):
		return fmt.Errorf("-rate %v, want in (0, %g] requests/s", c.rate, maxRate)
	case c.window <= 0 || c.window > maxDuration:
		return fmt.Errorf("-duration %v, want in (0, %v]", c.window, maxDuration)
	case c.rate*c.window.Seconds() < 1:
		return fmt.Errorf("-rate %v over -duration %v offers no request", c.rate, c.window)
	case c.clients < 1:
		return fmt.Errorf("-clients %d, want >= 1", c.clients)
	case c.inflight < c.clients:
		return fmt.Errorf("-inflight %d, want >= -clients (%d): each client keeps its share active", c.inflight, c.clients)
	case c.capacity < 1:
		return fmt.Errorf("-approx-capacity %d, want >= 1", c.capacity)
	}
	return c.out.validate()
}

func (c *routerConfig) parseModes() ([]router.Mode, error) {
	var ms []router.Mode
	for _, name := range strings.Split(c.modes, ",") {
		m, err := router.ParseMode(strings.TrimSpace(name))
		if err != nil {
			return nil, fmt.Errorf("-modes: %w", err)
		}
		if slices.Contains(ms, m) {
			return nil, fmt.Errorf("-modes: %v given twice", m)
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// runRouter drives the full router path: each request is selected, its
// worker publishes the prompt's blocks, its first token is reported, and it
// completes once -inflight newer requests have started; requests arrive at
// an offered rate from a pool of clients.
func runRouter(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("router", stderr)
	var c routerConfig
	c.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	ms, err := c.parseModes()
	if err != nil {
		return err
	}
	reqs, _, err := c.work.load()
	if err != nil {
		return err
	}
	if len(reqs) == 0 {
		return fmt.Errorf("the workload has no requests")
	}
	intr, release := watch(stop)
	defer release()
	rep := routerReport{Command: commandLine("router", args), Workers: c.workers, DPSize: c.dpSize}
	for _, m := range ms {
		res, err := c.drive(m, reqs, intr, stderr)
		if err != nil {
			return err
		}
		rep.Results = append(rep.Results, res)
		if intr.Load() {
			break
		}
	}
	if err := c.out.write(stdout, rep, func() { printRouter(stdout, rep) }, func() { printRouterBench(stdout, rep) }); err != nil {
		return err
	}
	if intr.Load() {
		return errInterrupted
	}
	return nil
}

// drive offers the load to a fresh router of mode m.
func (c *routerConfig) drive(m router.Mode, reqs []trace.Request, intr *interrupt, progress io.Writer) (routerResult, error) {
	cfg := router.DefaultConfig()
	cfg.BlockSize, cfg.IndexerLanes, cfg.DPSize, cfg.ApproxCapacity = c.blockSize, c.lanes, c.dpSize, c.capacity
	r, err := router.New(m, cfg, c.workers)
	if err != nil {
		return routerResult{}, err
	}
	defer r.Shutdown()
	d := &routerDrive{c: c, r: r, reqs: reqs, intr: intr, n: int(c.rate * c.window.Seconds()), dp: r.DPSize()}
	d.perWorker = make([]atomic.Int64, c.workers*d.dp)
	d.lat = make([][]time.Duration, c.clients)
	d.start = time.Now()
	var wg sync.WaitGroup
	for k := range c.clients {
		wg.Go(func() { d.client(k, c.inflight/c.clients) })
	}
	d.report(&wg, progress)
	if err := r.Flush(); err != nil && d.firstErr == nil {
		d.firstErr = err
	}
	if d.firstErr != nil && !intr.Load() {
		return routerResult{}, d.firstErr
	}
	return d.result(), nil
}

// routerDrive is one mode's run.
type routerDrive struct {
	c         *routerConfig
	r         *router.Router
	reqs      []trace.Request
	intr      *interrupt
	n, dp     int
	start     time.Time
	perWorker []atomic.Int64
	lat       [][]time.Duration
	next      atomic.Int64
	done      atomic.Int64
	halt      atomic.Bool // a client failed
	errOnce   sync.Once
	firstErr  error
}

func (d *routerDrive) fail(err error) {
	d.errOnce.Do(func() { d.firstErr = err; d.halt.Store(true) })
}

// client offers requests at their deadlines and keeps keep of them active.
func (d *routerDrive) client(k, keep int) {
	var tokens []uint32
	var active []uuid.UUID // this client's requests still running
	defer func() {
		for _, id := range active {
			if _, err := d.r.OnComplete(id); err != nil {
				d.fail(err)
			}
		}
	}()
	for {
		i := int(d.next.Add(1) - 1)
		if i >= d.n || d.halt.Load() || d.intr.Load() {
			return
		}
		if w := time.Until(d.start.Add(time.Duration(float64(i) / d.c.rate * float64(time.Second)))); w > time.Millisecond && !d.intr.sleep(w) {
			return
		}
		tr := d.reqs[i%len(d.reqs)]
		tokens = trace.Tokens(tokens[:0], tr)
		id, err := d.serve(k, i, tr, tokens)
		if err != nil {
			d.fail(err)
			return
		}
		active = append(active, id)
		if len(active) > keep {
			if _, err := d.r.OnComplete(active[0]); err != nil {
				d.fail(err)
				return
			}
			active = active[1:]
		}
		d.done.Add(1)
	}
}

// serve routes request i, makes its worker publish the prompt's blocks and
// reports its first token.
func (d *routerDrive) serve(k, i int, tr trace.Request, tokens []uint32) (uuid.UUID, error) {
	var id uuid.UUID
	binary.BigEndian.PutUint64(id[8:], uint64(i)+1)
	t0 := time.Now()
	w, err := d.r.SelectWorkerRank(context.Background(), router.Request{UUID: id, Tokens: tokens, MaxOutputTokens: tr.OutputLength})
	d.lat[k] = append(d.lat[k], time.Since(t0))
	if err != nil {
		return id, err
	}
	d.perWorker[int(w.ID)*d.dp+int(w.DPRank)].Add(1)
	local := hashing.LocalHashes(nil, tokens, d.c.blockSize, hashing.Options{})
	seq := hashing.SequenceHashes(nil, local)
	st := kvevent.Stored{Blocks: make([]kvevent.StoredBlock, len(local))}
	for j := range local {
		st.Blocks[j] = kvevent.StoredBlock{BlockHash: seq[j], TokensHash: local[j]}
	}
	if err := d.r.Sink(w.ID).Publish(kvevent.Event{ID: uint64(i), DPRank: w.DPRank, Data: st}); err != nil {
		return id, err
	}
	_, err = d.r.OnFirstToken(id)
	return id, err
}

// report prints a progress line a second until the clients are done.
func (d *routerDrive) report(wg *sync.WaitGroup, progress io.Writer) {
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastDone := d.start, int64(0)
	for {
		select {
		case <-finished:
			return
		case now := <-tick.C:
			n := d.done.Load()
			fmt.Fprintf(progress, "%s: %5.1fs %8.0f req/s, queue depth %d\n", d.r.Mode(), now.Sub(d.start).Seconds(),
				float64(n-lastDone)/now.Sub(last).Seconds(), d.r.Stats().Index.QueueDepth)
			last, lastDone = now, n
		}
	}
}

func (d *routerDrive) result() routerResult {
	elapsed := time.Since(d.start)
	st := d.r.Stats()
	res := routerResult{Mode: d.r.Mode().String(), Lanes: st.IndexerLanes, Requests: d.n, OfferedRPS: d.c.rate,
		ElapsedS: elapsed.Seconds(), DecisionUs: latencies(d.lat...), Interrupted: d.intr.Load(),
		Events: st.Index.Applied + st.Index.Rejected(), Rejected: st.Index.Rejected()}
	res.AchievedRPS = float64(d.done.Load()) / max(elapsed, d.c.window).Seconds()
	counts := make([]int, len(d.perWorker))
	for i := range d.perWorker {
		counts[i] = int(d.perWorker[i].Load())
	}
	res.WorkerSpreadC = replay.SpreadOf(counts).CV
	res.Saturated = res.AchievedRPS < 0.95*d.c.rate
	return res
}

func printRouter(w io.Writer, rep routerReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tlanes\toffered req/s\tachieved req/s\tdecision p50 µs\tp99 µs\tp99.9 µs\tevents\trejected\tspread cv\tverdict\t")
	for _, r := range rep.Results {
		verdict := "ok"
		switch {
		case r.Interrupted:
			verdict = "interrupted"
		case r.Saturated:
			verdict = "SATURATED"
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%d\t%d\t%.3f\t%s\t\n", r.Mode, r.Lanes, r.OfferedRPS, r.AchievedRPS,
			r.DecisionUs.P50, r.DecisionUs.P99, r.DecisionUs.P999, r.Events, r.Rejected, r.WorkerSpreadC, verdict)
	}
	tw.Flush()
}

func printRouterBench(w io.Writer, rep routerReport) {
	fmt.Fprintln(w, "pkg: github.com/kvradix/kvradix/cmd/loadgen")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "BenchmarkRouter/mode=%s/lanes=%d 1 %.0f ns/op %.0f p50-ns %.0f p99-ns %.0f p999-ns %.0f req/s\n",
			r.Mode, r.Lanes, r.ElapsedS*1e9, r.DecisionUs.P50*1e3, r.DecisionUs.P99*1e3, r.DecisionUs.P999*1e3, r.AchievedRPS)
	}
}
