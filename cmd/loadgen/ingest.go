package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
	"github.com/kvradix/kvradix/shardpool"
)

type ingestResult struct {
	Engines        int     `json:"engines"`
	Events         int     `json:"events"`
	Batches        int     `json:"batches"`
	BlocksPerEvent int     `json:"blocks_per_event"`
	BlockSize      int     `json:"block_size"`
	ElapsedS       float64 `json:"elapsed_s"`
	EventsS        float64 `json:"events_s"`
	BlocksS        float64 `json:"blocks_s"`
	DecodeNsEvent  float64 `json:"decode_ns_per_event"`
	DroppedBatches int     `json:"dropped_batches"`
	GapsFound      uint64  `json:"gaps_found"`
	GapsRepaired   uint64  `json:"gaps_repaired"`
	GapsLost       uint64  `json:"gaps_lost"`
	BatchesLost    uint64  `json:"batches_lost"`
	Replayed       uint64  `json:"replayed_batches"`
	Restarts       uint64  `json:"restarts"`
	Rejected       uint64  `json:"rejected_events"`
	IndexEqual     bool    `json:"index_equal"`
	IndexDiff      string  `json:"index_diff,omitempty"`
}

// runIngest: mock vLLM engines publish over ZeroMQ on loopback into the
// subscriber and a pool indexer; the final index is checked against one
// built directly from the same events.
func runIngest(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("ingest", stderr)
	engines := fs.Int("engines", 4, "mock engines publishing")
	events := fs.Int("events", 40000, "BlockStored/BlockRemoved events in all")
	perBatch := fs.Int("batch", 8, "events per batch (one engine step)")
	blocks := fs.Int("blocks-per-event", 64, "blocks per BlockStored")
	blockSize := fs.Int("block-size", 16, "tokens per block")
	removes := fs.Float64("remove-ratio", 0.1, "share of events that are BlockRemoved")
	drop := fs.Float64("drop", 0.002, "probability a live batch is dropped on the wire (repaired by replay)")
	restart := fs.Bool("restart", true, "restart engine 0 half way")
	lanes := fs.Int("lanes", 2, "indexer lanes")
	seed := fs.Uint64("seed", 1, "seed")
	asJSON := fs.Bool("json", false, "print one JSON object")
	format := fs.String("format", "table", "output: table, or bench")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("ingest: unexpected argument %q", fs.Arg(0))
	case *engines < 1 || *events < 1 || *perBatch < 1 || *blocks < 1 || *blockSize < 1 || *lanes < 1:
		return fmt.Errorf("-engines, -events, -batch, -blocks-per-event, -block-size and -lanes must be >= 1")
	case *drop < 0 || *drop >= 1 || *removes < 0 || *removes >= 1:
		return fmt.Errorf("-drop and -remove-ratio must be in [0, 1)")
	case *format != "table" && *format != "bench":
		return fmt.Errorf("-format %q, want table or bench", *format)
	}
	stopped, release := watch(stop)
	defer release()

	// The engines' event streams, decided up front.
	nBatches := (*events/(*engines) + *perBatch - 1) / *perBatch
	type engine struct {
		pub     *vllm.Publisher
		batches [][]vllm.Event
		restart int // batch index to restart before; -1 for none
	}
	engs := make([]*engine, *engines)
	payloadBytes := 0
	for i := range engs {
		enc, framing := vllm.ArrayEncoding, vllm.FramingLegacy
		if i%2 == 1 {
			enc, framing = vllm.MapEncoding, vllm.FramingTopic
		}
		pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
			Topic: fmt.Sprintf("kv@engine-%d@model", i), Encoding: enc, Framing: framing})
		if err != nil {
			return err
		}
		defer pub.Close()
		e := &engine{pub: pub, restart: -1}
		if *restart && i == 0 {
			e.restart = nBatches / 2
		}
		gen := vllm.NewSynthEngine(*seed+uint64(i), *blockSize, *blocks, *removes)
		for b := range nBatches {
			if b == e.restart {
				gen.Restart()
			}
			batch := make([]vllm.Event, *perBatch)
			for k := range batch {
				batch[k] = gen.Step()
			}
			e.batches = append(e.batches, batch)
		}
		engs[i] = e
	}
	// Decode cost, measured on the payloads themselves.
	var payloads [][]byte
	for _, b := range engs[0].batches[:min(200, nBatches)] {
		p := vllm.AppendBatch(nil, &vllm.Batch{Events: b}, vllm.MapEncoding)
		payloads = append(payloads, p)
		payloadBytes += len(p)
	}
	t0 := time.Now()
	decoded := 0
	for range 5 {
		for _, p := range payloads {
			b, err := vllm.DecodeBatch(p)
			if err != nil {
				return err
			}
			decoded += len(b.Events)
		}
	}
	decodeNs := float64(time.Since(t0).Nanoseconds()) / float64(decoded)

	pool := shardpool.NewPool(*lanes, *blockSize)
	defer pool.Close()
	eps := make([]vllm.Endpoint, len(engs))
	for i, e := range engs {
		eps[i] = vllm.Endpoint{Worker: kvevent.WorkerID(i), Address: e.pub.Addr(), Replay: e.pub.ReplayAddr(), Topic: fmt.Sprintf("kv@engine-%d@", i)}
	}
	sub, err := vllm.NewSubscriber(pool, vllm.SubscriberConfig{BlockSize: *blockSize}, eps...)
	if err != nil {
		return err
	}
	defer sub.Close()
	// Wait out PUB/SUB's slow-joiner start with empty batches.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ready := true
		for i, got := range sub.Received() {
			if got == 0 {
				ready = false
				if _, err := engs[i].pub.Publish(nil); err != nil {
					return err
				}
			}
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ingest: the subscriber did not connect")
		}
	}
	var dropped atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(engs))
	// caughtUp waits until the subscriber applied engine i's batches up to
	// seq. A dropped last batch would go unseen (a gap shows only when a
	// later batch arrives), so after a quiet spell it publishes an empty
	// heartbeat batch that reveals it.
	//
	// Received is per sequence, and an engine's sequence starts again at
	// its restart: until the subscriber has seen the restart, the count it
	// reports is the old life's, so waiting also needs every restart made
	// so far to have been seen.
	var restarted atomic.Uint64
	caughtUp := func(i int, seq uint64) {
		pub := engs[i].pub
		// Restarts first: the subscriber resets Received before counting
		// a restart.
		behind := func() bool { return sub.Stats().Restarts < restarted.Load() || sub.Received()[i] <= seq }
		for quiet := 0; behind() && !stopped.Load(); quiet++ {
			time.Sleep(time.Millisecond)
			if quiet == 50 {
				drop := pub.DropLive
				pub.DropLive = nil
				s, err := pub.Publish(nil)
				pub.DropLive = drop
				if err == nil {
					seq = s
				}
				quiet = 0
			}
		}
	}
	for i, e := range engs {
		rng := rand.New(rand.NewPCG(*seed, uint64(i)))
		e.pub.DropLive = func(uint64) bool {
			if rng.Float64() < *drop {
				dropped.Add(1)
				return true
			}
			return false
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var seq uint64
			for b, evs := range e.batches {
				if stopped.Load() {
					return
				}
				if b == e.restart {
					// Let the subscriber catch up first: a restart empties the
					// replay ring, so gaps still open would be lost for real.
					caughtUp(i, seq)
					e.pub.Restart()
					restarted.Add(1)
				}
				last := b == len(e.batches)-1
				if last {
					e.pub.DropLive = nil // a final drop would stay unseen
				}
				s, err := e.pub.Publish(evs)
				if err != nil {
					errs[i] = err
					return
				}
				seq = s
			}
			caughtUp(i, seq)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	if err := sub.Flush(); err != nil {
		return err
	}
	elapsed := time.Since(start)

	// The index built directly from every event the engines produced.
	want := radix.NewTree()
	for i, e := range engs {
		conv := vllm.NewConverter(kvevent.WorkerID(i), *blockSize)
		for b, evs := range e.batches {
			if b == e.restart {
				_ = want.Apply(kvevent.RouterEvent{WorkerID: kvevent.WorkerID(i), Event: kvevent.Event{Data: kvevent.Cleared{}}})
			}
			for _, ev := range conv.Convert(nil, &vllm.Batch{Events: evs}) {
				_ = want.Apply(ev)
			}
		}
	}
	st := sub.Stats()
	total := nBatches * *perBatch * len(engs)
	res := ingestResult{
		Engines: len(engs), Events: total, Batches: nBatches * len(engs), BlocksPerEvent: *blocks, BlockSize: *blockSize,
		ElapsedS: elapsed.Seconds(), EventsS: float64(total) / elapsed.Seconds(),
		BlocksS:       float64(st.Convert.Stored) * float64(*blocks) / elapsed.Seconds(),
		DecodeNsEvent: decodeNs, DroppedBatches: int(dropped.Load()),
		GapsFound: st.GapsFound, GapsRepaired: st.GapsRepaired, GapsLost: st.GapsLost, BatchesLost: st.BatchesLost,
		Replayed: st.Replayed, Restarts: st.Restarts, Rejected: st.Convert.Rejected() + pool.Stats().Rejected(),
	}
	if stopped.Load() {
		res.IndexDiff = "interrupted"
	} else {
		a, errA := radixtest.FromDump(pool.Index())
		b, errB := radixtest.FromDump(want)
		switch {
		case errA != nil || errB != nil:
			res.IndexDiff = fmt.Sprint(errA, errB)
		default:
			res.IndexDiff = a.Diff(b)
			res.IndexEqual = res.IndexDiff == "" && pool.Index().Size() == want.Size()
		}
	}
	switch {
	case *asJSON:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	case *format == "bench":
		fmt.Fprintf(stdout, "pkg: github.com/kvradix/kvradix/cmd/loadgen\nBenchmarkIngest/engines=%d/blocks=%d 1 %.0f ns/op %.0f events/s %.0f blocks/s %.0f decode-ns/event\n",
			res.Engines, res.BlocksPerEvent, res.ElapsedS*1e9, res.EventsS, res.BlocksS, res.DecodeNsEvent)
	default:
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "engines\t%d (array+legacy replay framing, map+topic framing alternating)\n", res.Engines)
		fmt.Fprintf(tw, "events\t%d in %d batches, %d blocks of %d tokens per BlockStored\n", res.Events, res.Batches, res.BlocksPerEvent, res.BlockSize)
		fmt.Fprintf(tw, "end to end\t%.0f events/s, %.0f blocks/s (%.2fs)\n", res.EventsS, res.BlocksS, res.ElapsedS)
		fmt.Fprintf(tw, "decode\t%.0f ns/event (%d-byte batches)\n", res.DecodeNsEvent, payloadBytes/max(1, len(payloads)))
		fmt.Fprintf(tw, "gaps\t%d batches dropped on the wire; %d gaps found, %d repaired (%d batches replayed), %d lost (%d batches)\n",
			res.DroppedBatches, res.GapsFound, res.GapsRepaired, res.Replayed, res.GapsLost, res.BatchesLost)
		fmt.Fprintf(tw, "restarts\t%d\n", res.Restarts)
		fmt.Fprintf(tw, "rejected\t%d events\n", res.Rejected)
		fmt.Fprintf(tw, "final index\tequal to the direct build: %v %s\n", res.IndexEqual, res.IndexDiff)
		tw.Flush()
	}
	for _, l := range st.RecentLosses {
		fmt.Fprintln(stderr, "loss:", l)
	}
	if stopped.Load() {
		return fmt.Errorf("interrupted: the results above are partial")
	}
	if !res.IndexEqual && res.GapsLost == 0 {
		return fmt.Errorf("ingest: the final index differs although no loss was counted: %s", res.IndexDiff)
	}
	return nil
}
