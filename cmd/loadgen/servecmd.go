package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/stats"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix/holdings"
	"github.com/kvradix/kvradix/serve"
	"github.com/kvradix/kvradix/trace"
)

// serveResult is `loadgen serve`'s report.
type serveResult struct {
	Command     string  `json:"command"`
	Trace       string  `json:"trace"`
	URL         string  `json:"url"`
	Engines     int     `json:"engines"`
	Requests    int     `json:"requests"` // trace requests the engines served
	Batches     int     `json:"batches"`
	BatchesPerS float64 `json:"batches_per_s"`
	Queries     int     `json:"queries"`
	HashesPerQ  float64 `json:"hashes_per_query"`
	MatchedPct  float64 `json:"matched_pct"` // of the blocks queried, those the best instance held
	OfferedQPS  float64 `json:"offered_qps"`
	AchievedQPS float64 `json:"achieved_qps"`
	QueryP50Ms  float64 `json:"query_p50_ms"`
	QueryP99Ms  float64 `json:"query_p99_ms"`
	Errors      int     `json:"errors"`
	DumpEqual   bool    `json:"dump_equal"`            // /dump equals the events published
	Interrupted bool    `json:"interrupted,omitempty"` // stopped by SIGINT: the figures are partial
}

type serveConfig struct {
	url      string
	token    string
	engines  int
	rate     float64
	clients  int
	window   time.Duration
	out      output
	work     workloadFlags
	blockLen int
	stretch  int
	capacity int
	cpuprof  string
	sample   string
	timeout  time.Duration // each HTTP request to the service
	control  *http.Client  // registrations and the waits, with timeout
}

func (c *serveConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "url", "", "the base URL of a running kvradix serve, http://host:port (default: start one in-process on loopback)")
	fs.StringVar(&c.token, "token", "", "the service's bearer token for /register (its -token; the in-process service is started with it)")
	fs.IntVar(&c.engines, "engines", 4, "vLLM-compatible publishers to register, serving the trace's requests in turn")
	fs.Float64Var(&c.rate, "rate", 5000, "queries per second offered, over all clients")
	fs.IntVar(&c.clients, "clients", 16, "concurrent HTTP clients, querying the trace's prompts by block hash")
	fs.DurationVar(&c.window, "duration", 5*time.Second, "how long the engines take to serve the trace (spread evenly) while clients query")
	fs.IntVar(&c.blockLen, "block-size", 16, "tokens per KV block")
	fs.IntVar(&c.stretch, "stretch", 3, "blocks per trace hash id (trace.Stretch): prompts of the embedded trace average 24·stretch blocks")
	fs.IntVar(&c.capacity, "engine-blocks", 16384, "blocks each engine's prefix cache holds before evicting")
	fs.DurationVar(&c.timeout, "request-timeout", 10*time.Second, "the longest one HTTP request to the service may take, its answer read (a service that accepts and never answers fails the run)")
	c.work.register(fs)
	fs.StringVar(&c.cpuprof, "cpuprofile", "", "write a CPU profile of the timed part (service, engines and clients) to `file`")
	fs.StringVar(&c.sample, "sample", "", "write a POST /query body for the trace's last prompt, whose blocks the service then holds, to `file` (for curl -H 'Content-Type: application/json' -d @file: the service refuses a body not labelled JSON)")
	c.out.register(fs)
}

// Bounds of loadgen serve's flags: past them the trace's prompts, the
// publishers or the clients would take more memory than a run can have.
const (
	maxEngines = 1024
	maxClients = 4096
	maxStretch = 64
)

// runServe drives the service as its users would: engines serving the
// trace's requests in turn publish their KV events over ZeroMQ into it,
// while HTTP clients query the trace's prompts at an offered rate; at the
// end its /dump must equal what the engines published.
func runServe(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("serve", stderr)
	var c serveConfig
	c.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case c.engines < 1 || c.engines > maxEngines || c.clients < 1 || c.clients > maxClients:
		return fmt.Errorf("-engines %d, -clients %d: want in [1, %d] and [1, %d]", c.engines, c.clients, maxEngines, maxClients)
	case c.stretch < 1 || c.stretch > maxStretch:
		return fmt.Errorf("-stretch %d, want in [1, %d]", c.stretch, maxStretch)
	case c.capacity < 1 || c.capacity > serve.MaxKVBlocks:
		return fmt.Errorf("-engine-blocks %d, want in [1, %d]", c.capacity, serve.MaxKVBlocks)
	case c.blockLen < 1 || c.blockLen > trace.TraceBlockSize:
		return fmt.Errorf("-block-size %d, want in [1, %d]", c.blockLen, trace.TraceBlockSize)
	case !(c.rate > 0 && c.rate <= maxRate):
		return fmt.Errorf("-rate %v, want in (0, %g]", c.rate, maxRate)
	case c.window <= 0 || c.window > maxDuration:
		return fmt.Errorf("-duration %v, want in (0, %v]", c.window, maxDuration)
	case c.timeout <= 0 || c.timeout > maxDuration:
		return fmt.Errorf("-request-timeout %v, want in (0, %v]", c.timeout, maxDuration)
	}
	c.control = &http.Client{Timeout: c.timeout}
	if err := c.out.validate(); err != nil {
		return err
	}
	if c.url != "" {
		if err := serve.CheckPeer(c.url); err != nil {
			return fmt.Errorf("-url: %w", err)
		}
	}
	prof, err := createProfiles(c.cpuprof, "")
	if err != nil {
		return err
	}
	defer prof.close()
	reqs, name, err := c.work.load()
	if err != nil {
		return err
	}
	for i, r := range reqs {
		reqs[i] = trace.Stretch(r, c.stretch, c.blockLen)
	}
	if err := c.writeSample(reqs); err != nil { // before the run, whose results a bad path would lose
		return err
	}
	intr, release := watch(stop)
	defer release()
	ctx, cancel := intr.context()
	defer cancel()
	base := c.url
	if base == "" {
		svc := serve.New(serve.Config{Token: c.token})
		defer svc.Close()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		base = "http://" + ln.Addr().String()
	}
	res := serveResult{Command: commandLine("serve", args), Trace: name, URL: base, Engines: c.engines, Requests: len(reqs), OfferedQPS: c.rate}
	batches, want := c.engineBatches(reqs)
	queries := c.queries(reqs)
	pubs, err := c.startEngines(ctx, base)
	defer func() {
		for _, p := range pubs {
			p.Close()
		}
	}()
	if intr.Load() {
		return errInterrupted
	}
	if err != nil {
		return err
	}
	stopProfile, err := prof.cpu.startCPU()
	if err != nil {
		return err
	}
	start := time.Now()
	var wg sync.WaitGroup
	tallies := make([]queryTally, c.clients)
	done := make(chan struct{})
	for k := range c.clients {
		wg.Go(func() { tallies[k] = c.query(base, k, queries, done, intr) })
	}
	var pubWG sync.WaitGroup
	published := make([]int, len(pubs)) // batches, each publisher's
	for i, p := range pubs {
		pubWG.Go(func() {
			every, next := c.window/time.Duration(max(1, len(batches[i]))), time.Now()
			for _, evs := range batches[i] {
				if d := time.Until(next); d > 0 && !intr.sleep(d) {
					return
				}
				next = next.Add(every)
				_, _ = p.Publish(evs)
				published[i]++
			}
		})
	}
	pubWG.Wait()
	close(done)
	elapsed := time.Since(start)
	wg.Wait()
	stopProfile()
	for _, n := range published {
		res.Batches += n
	}
	res.BatchesPerS = float64(res.Batches) / elapsed.Seconds()
	var lat [][]time.Duration
	hashes, matched := 0, 0
	for _, t := range tallies {
		lat = append(lat, t.lat)
		res.Errors += t.errs
		hashes += t.hashes
		matched += t.matched
	}
	l := stats.Micros(lat...)
	res.Queries = len(l)
	res.AchievedQPS = float64(len(l)) / elapsed.Seconds()
	res.QueryP50Ms, res.QueryP99Ms = stats.Percentile(l, 0.5)/1e3, stats.Percentile(l, 0.99)/1e3
	if res.Queries > 0 {
		res.HashesPerQ = float64(hashes) / float64(res.Queries)
	}
	if hashes > 0 {
		res.MatchedPct = 100 * float64(matched) / float64(hashes)
	}
	res.DumpEqual = c.dumpEquals(ctx, base, want)
	res.Interrupted = intr.Load()
	err = c.out.write(stdout, res, func() {
		fmt.Fprintf(stdout, "%s: %d engines served %d requests in %d batches in %.2fs (%.0f batches/s); %d queries of %.0f hashes (%.1f%% of them held) at %.0f/s (offered %.0f): p50 %.2f ms, p99 %.2f ms; %d errors; /dump equals the events: %v\n",
			res.Trace, res.Engines, res.Requests, res.Batches, elapsed.Seconds(), res.BatchesPerS, res.Queries, res.HashesPerQ, res.MatchedPct, res.AchievedQPS, res.OfferedQPS, res.QueryP50Ms, res.QueryP99Ms, res.Errors, res.DumpEqual)
		if res.Interrupted {
			fmt.Fprintln(stdout, "interrupted: the figures above are partial")
		}
	}, func() {
		fmt.Fprintf(stdout, "BenchmarkServe/engines=%d 1 %.0f ns/op %.0f batches/s %.0f query-p50-ns %.0f query-p99-ns\n",
			res.Engines, float64(elapsed.Nanoseconds()), res.BatchesPerS, res.QueryP50Ms*1e6, res.QueryP99Ms*1e6)
	})
	if err == nil && intr.Load() {
		return errInterrupted
	}
	return err
}

// writeSample writes -sample: the /query body of the last request's
// prompt.
func (c *serveConfig) writeSample(reqs []trace.Request) error {
	if c.sample == "" || len(reqs) == 0 {
		return nil
	}
	body, err := json.Marshal(serve.Query{ModelName: "trace", TokenIDs: trace.TokensOf(nil, reqs[len(reqs)-1], c.blockLen)})
	if err != nil {
		return err
	}
	return os.WriteFile(c.sample, append(body, '\n'), 0o644)
}

// engineBatches deals the requests to the engines in turn and returns each
// engine's batches (one per request it serves: what it stored and
// evicted), and the holdings they make.
func (c *serveConfig) engineBatches(reqs []trace.Request) ([][][]vllm.Event, holdings.Set) {
	want := holdings.Set{}
	batches := make([][][]vllm.Event, c.engines)
	engines := make([]*traceEngine, c.engines)
	convs := make([]*vllm.Converter, c.engines)
	for i := range engines {
		engines[i], convs[i] = newTraceEngine(c.blockLen, c.capacity), vllm.NewConverter(kvevent.WorkerID(i), c.blockLen)
	}
	for k, r := range reqs {
		i := k % c.engines
		evs := engines[i].serve(r)
		for _, ev := range convs[i].Convert(nil, &vllm.Batch{Events: evs}) {
			_ = want.Apply(ev)
		}
		batches[i] = append(batches[i], evs)
	}
	return batches, want
}

// queries returns each request's local block hashes, what clients ask
// about.
func (c *serveConfig) queries(reqs []trace.Request) [][]uint64 {
	out := make([][]uint64, len(reqs))
	var toks []uint32
	for k, r := range reqs {
		toks = trace.TokensOf(toks[:0], r, c.blockLen)
		out[k] = hashing.LocalHashes(nil, toks, c.blockLen, hashing.Options{})
	}
	return out
}

// startEngines starts the publishers and registers them.
func (c *serveConfig) startEngines(ctx context.Context, base string) ([]*vllm.Publisher, error) {
	var pubs []*vllm.Publisher
	for i := range c.engines {
		p, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
		if err != nil {
			return pubs, err
		}
		pubs = append(pubs, p)
		// Each with its pool, as real engines register: the service sizes
		// the model's index for them (serve.Registration.TotalKVBlocks).
		body, _ := json.Marshal(serve.Registration{InstanceID: uint64(i), Endpoint: p.Addr(), ReplayEndpoint: p.ReplayAddr(), ModelName: "trace", BlockSize: c.blockLen, TotalKVBlocks: c.capacity})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/register", bytes.NewReader(body))
		if err != nil {
			return pubs, err
		}
		req.Header.Set("Content-Type", "application/json")
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := c.control.Do(req)
		if err != nil {
			return pubs, fmt.Errorf("register engine %d: %w", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK { // 201 today, 200 before
			return pubs, fmt.Errorf("register engine %d: %s", i, resp.Status)
		}
	}
	return pubs, c.awaitActive(ctx, base)
}

// awaitActive waits (30 s at most) until GET /workers shows every engine
// active: a registration does not wait for its engine to be dialled, and
// what an engine publishes before it is subscribed to is not heard. A
// service that does not say (no status) is taken at its word.
func (c *serveConfig) awaitActive(ctx context.Context, base string) error {
	var last string
	ok := poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		var ws []serve.Worker
		if err := c.getJSON(ctx, base+"/workers?model_name=trace", &ws); err != nil {
			last = err.Error()
			return false
		}
		active := 0
		for _, w := range ws {
			if w.Status == "active" || w.Status == "" {
				active++
			}
		}
		last = fmt.Sprintf("%d of %d engines active: %+v", active, c.engines, ws)
		return active == c.engines
	})
	switch {
	case ok:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("the engines were not all subscribed to within 30 s: %s", last)
}

// poll calls try every period until it is done, for within at most, or
// until ctx ends; it reports whether try was done.
func poll(ctx context.Context, within, period time.Duration, try func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if try() {
			return true
		}
		if time.Now().Add(period).After(deadline) {
			return false
		}
		t := time.NewTimer(period)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// getJSON decodes the service's answer to GET url into v, within
// -request-timeout; an answer other than 200 is an error with its status
// and the start of its body.
func (c *serveConfig) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.control.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", req.URL.Path, resp.Status, bytes.TrimSpace(b))
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// queryTally is one client's count.
type queryTally struct {
	lat                   []time.Duration
	errs, hashes, matched int
}

// query sends /query_by_hash for the trace's prompts (client k asks
// about requests k, k+clients, ..., round and round) at its share of the
// offered rate until done.
func (c *serveConfig) query(base string, k int, queries [][]uint64, done <-chan struct{}, intr *interrupt) queryTally {
	every := time.Duration(float64(time.Second) * float64(c.clients) / c.rate)
	// One connection of its own, kept alive: the default transport keeps
	// two idle connections a host, so 16 clients would each open new ones
	// over and over, and measure TCP handshakes.
	client := &http.Client{Timeout: c.timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	var t queryTally
	// Clients are spread over the period, so that the offered rate comes
	// evenly, not as bursts of every client at once.
	next := time.Now().Add(every * time.Duration(k) / time.Duration(c.clients))
	for q := k % len(queries); ; q = (q + c.clients) % len(queries) {
		select {
		case <-done:
			return t
		case <-intr.c:
			return t
		default:
		}
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(every)
		body, _ := json.Marshal(serve.HashQuery{BlockHashes: queries[q], ModelName: "trace"})
		t0 := time.Now()
		resp, err := client.Post(base+"/query_by_hash", "application/json", bytes.NewReader(body))
		if err != nil {
			t.errs++
			continue
		}
		answer, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.lat = append(t.lat, time.Since(t0))
		if err != nil || resp.StatusCode != http.StatusOK {
			t.errs++
			continue
		}
		t.hashes += len(queries[q])
		t.matched += longestMatch(answer)
	}
}

// longestMatch reads, from a query's answer, the blocks the best instance
// holds: the length of its frequencies.
func longestMatch(answer []byte) int {
	_, f, ok := bytes.Cut(answer, []byte(`"frequencies":[`))
	if f, _, _ = bytes.Cut(f, []byte("]")); !ok || len(f) == 0 {
		return 0
	}
	return bytes.Count(f, []byte(",")) + 1
}

// dumpEquals waits (20 s at most) until the service's /dump of the model
// equals want.
func (c *serveConfig) dumpEquals(ctx context.Context, base string, want holdings.Set) bool {
	return poll(ctx, 20*time.Second, 100*time.Millisecond, func() bool {
		var dump serve.Dump // either shape: Dynamo's today or the bare list before
		if c.getJSON(ctx, base+"/dump", &dump) != nil {
			return false
		}
		got := holdings.Set{}
		for _, ev := range dump["trace:"+serve.DefaultTenant].Events { // in order: parents first
			_ = got.Apply(ev)
		}
		return got.Diff(want) == ""
	})
}
