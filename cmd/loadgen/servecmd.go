package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/stats"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix/holdings"
	"github.com/kvradix/kvradix/serve"
)

// serveResult is `loadgen serve`'s report.
type serveResult struct {
	Command     string  `json:"command"`
	URL         string  `json:"url"`
	Engines     int     `json:"engines"`
	Events      int     `json:"events"`
	EventsPerS  float64 `json:"events_per_s"`
	Queries     int     `json:"queries"`
	OfferedQPS  float64 `json:"offered_qps"`
	AchievedQPS float64 `json:"achieved_qps"`
	QueryP50Ms  float64 `json:"query_p50_ms"`
	QueryP99Ms  float64 `json:"query_p99_ms"`
	Errors      int     `json:"errors"`
	DumpEqual   bool    `json:"dump_equal"` // /dump equals the events published
}

type serveConfig struct {
	url      string
	engines  int
	batches  int
	rate     float64
	clients  int
	window   time.Duration
	out      output
	blockLen int
	cpuprof  string
}

func (c *serveConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "url", "", "a running `kvradix serve` (default: start one in-process on loopback)")
	fs.IntVar(&c.engines, "engines", 4, "vLLM-compatible publishers to register")
	fs.IntVar(&c.batches, "batches", 2000, "batches each engine publishes")
	fs.Float64Var(&c.rate, "rate", 5000, "queries per second offered, over all clients")
	fs.IntVar(&c.clients, "clients", 16, "concurrent HTTP clients")
	fs.DurationVar(&c.window, "duration", 5*time.Second, "how long engines publish (spread evenly) and clients query")
	fs.StringVar(&c.cpuprof, "cpuprofile", "", "write a CPU profile of the timed part (service, engines and clients) to `file`")
	c.out.register(fs)
}

// runServe drives the service as its users would: engines publish KV
// events over ZeroMQ into it while HTTP clients query at an offered rate;
// at the end its /dump must equal what the engines published.
func runServe(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("serve", stderr)
	c := serveConfig{blockLen: 16}
	c.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case c.engines < 1 || c.batches < 1 || c.clients < 1:
		return errors.New("-engines, -batches and -clients want >= 1")
	case !(c.rate > 0 && c.rate <= maxRate):
		return fmt.Errorf("-rate %v, want in (0, %g]", c.rate, maxRate)
	case c.window <= 0 || c.window > maxDuration:
		return fmt.Errorf("-duration %v, want in (0, %v]", c.window, maxDuration)
	}
	if err := c.out.validate(); err != nil {
		return err
	}
	intr, release := watch(stop)
	defer release()
	base := c.url
	if base == "" {
		svc := serve.New(serve.Config{})
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
	res := serveResult{Command: commandLine("serve", args), URL: base, Engines: c.engines, OfferedQPS: c.rate}
	pubs, want, err := c.startEngines(base)
	defer func() {
		for _, p := range pubs {
			p.Close()
		}
	}()
	if err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(c.cpuprof)
	if err != nil {
		return err
	}
	start := time.Now()
	var wg sync.WaitGroup
	lat := make([][]time.Duration, c.clients)
	errs := make([]int, c.clients)
	done := make(chan struct{})
	for k := range c.clients {
		wg.Go(func() { lat[k], errs[k] = c.query(base, k, done, intr) })
	}
	var pubWG sync.WaitGroup
	every := c.window / time.Duration(c.batches)
	for i, p := range pubs {
		pubWG.Go(func() {
			next := time.Now()
			c.batchesOf(i, func(evs []vllm.Event) {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				next = next.Add(every)
				_, _ = p.Publish(evs)
			})
		})
	}
	pubWG.Wait()
	close(done)
	elapsed := time.Since(start)
	wg.Wait()
	stopProfile()
	res.Events = c.engines * c.batches
	res.EventsPerS = float64(res.Events) / elapsed.Seconds()
	l := stats.Micros(lat...)
	res.Queries = len(l)
	res.AchievedQPS = float64(len(l)) / elapsed.Seconds()
	res.QueryP50Ms, res.QueryP99Ms = stats.Percentile(l, 0.5)/1e3, stats.Percentile(l, 0.99)/1e3
	for _, e := range errs {
		res.Errors += e
	}
	res.DumpEqual = c.dumpEquals(base, want)
	return c.out.write(stdout, res, func() {
		fmt.Fprintf(stdout, "%d engines, %d batches of 4 events in %.2fs (%.0f batches/s); %d queries of 64 hashes at %.0f/s (offered %.0f): p50 %.2f ms, p99 %.2f ms; %d errors; /dump equals the events: %v\n",
			res.Engines, res.Events, elapsed.Seconds(), res.EventsPerS, res.Queries, res.AchievedQPS, res.OfferedQPS, res.QueryP50Ms, res.QueryP99Ms, res.Errors, res.DumpEqual)
	}, func() {
		fmt.Fprintf(stdout, "BenchmarkServe/engines=%d 1 %.0f ns/op %.0f batches/s %.0f query-p50-ns %.0f query-p99-ns\n",
			res.Engines, float64(elapsed.Nanoseconds()), res.EventsPerS, res.QueryP50Ms*1e6, res.QueryP99Ms*1e6)
	})
}

// startEngines starts the publishers, registers them, and returns the
// holdings their batches make.
func (c *serveConfig) startEngines(base string) ([]*vllm.Publisher, holdings.Set, error) {
	want := holdings.Set{}
	var pubs []*vllm.Publisher
	for i := range c.engines {
		p, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
		if err != nil {
			return pubs, nil, err
		}
		pubs = append(pubs, p)
		body, _ := json.Marshal(serve.Registration{InstanceID: uint64(i), Endpoint: p.Addr(), ReplayEndpoint: p.ReplayAddr(), ModelName: "synth", BlockSize: c.blockLen})
		resp, err := http.Post(base+"/register", "application/json", bytes.NewReader(body))
		if err != nil {
			return pubs, nil, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return pubs, nil, fmt.Errorf("register engine %d: %s", i, resp.Status)
		}
		conv := vllm.NewConverter(kvevent.WorkerID(i), c.blockLen)
		c.batchesOf(i, func(evs []vllm.Event) {
			for _, ev := range conv.Convert(nil, &vllm.Batch{Events: evs}) {
				_ = want.Apply(ev)
			}
		})
	}
	return pubs, want, nil
}

// batchesOf generates engine i's batches.
func (c *serveConfig) batchesOf(i int, f func([]vllm.Event)) {
	gen := vllm.NewSynthEngine(uint64(i)+1, c.blockLen, 8, 0.3)
	for range c.batches {
		evs := make([]vllm.Event, 4)
		for k := range evs {
			evs[k] = gen.Step()
		}
		f(evs)
	}
}

// query sends /query_by_hash at its share of the offered rate until done.
func (c *serveConfig) query(base string, k int, done <-chan struct{}, intr *interrupt) ([]time.Duration, int) {
	r := rand.New(rand.NewPCG(uint64(k), 9))
	every := time.Duration(float64(time.Second) * float64(c.clients) / c.rate)
	// One connection of its own, kept alive: the default transport keeps
	// two idle connections a host, so 16 clients would each open new ones
	// over and over, and measure TCP handshakes.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	var lat []time.Duration
	errs := 0
	next := time.Now()
	for {
		select {
		case <-done:
			return lat, errs
		case <-intr.c:
			return lat, errs
		default:
		}
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(every)
		hashes := make([]uint64, 64)
		for i := range hashes {
			hashes[i] = r.Uint64()
		}
		body, _ := json.Marshal(serve.HashQuery{BlockHashes: hashes, ModelName: "synth"})
		t0 := time.Now()
		resp, err := client.Post(base+"/query_by_hash", "application/json", bytes.NewReader(body))
		if err != nil {
			errs++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lat = append(lat, time.Since(t0))
		if resp.StatusCode != http.StatusOK {
			errs++
		}
	}
}

// dumpEquals waits (20 s at most) until the service's /dump of the model
// equals want.
func (c *serveConfig) dumpEquals(base string, want holdings.Set) bool {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(base + "/dump")
		if err != nil {
			continue
		}
		var dump map[string][]kvevent.RouterEvent
		err = json.NewDecoder(resp.Body).Decode(&dump)
		resp.Body.Close()
		if err != nil {
			continue
		}
		got := holdings.Set{}
		for _, ev := range dump["synth:"+serve.DefaultTenant] { // in order: parents first
			_ = got.Apply(ev)
		}
		if got.Diff(want) == "" {
			return true
		}
	}
	return false
}
