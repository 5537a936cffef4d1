package main

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/rss"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix/holdings"
	"github.com/kvradix/kvradix/serve"
	"github.com/kvradix/kvradix/shardpool"
)

type ingestResult struct {
	Command        string  `json:"command"`
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
	Disconnects    uint64  `json:"disconnects"`
	FramesRefused  uint64  `json:"frames_refused"`
	SuspectSeqs    uint64  `json:"suspect_seqs"`
	Faults         bool    `json:"faults"`
	PayloadMB      float64 `json:"payload_mb"`
	MemLimitMiB    int     `json:"mem_limit_mib"`
	PeakRSSMB      float64 `json:"peak_rss_mb"`
	IndexEqual     bool    `json:"index_equal"`
	IndexDiff      string  `json:"index_diff,omitempty"`
	Interrupted    bool    `json:"interrupted,omitempty"`
}

// ingestConfig is what `loadgen ingest` was asked to do.
type ingestConfig struct {
	out        output
	engines    int
	events     int
	perBatch   int
	blocks     int
	blockSize  int
	removes    float64
	drop       float64
	restart    bool
	lanes      int
	seed       uint64
	cpuprofile string
	memprofile string
	faults     bool
	memLimit   int // MiB; 0 none, -1 auto (see memLimitFor)
}

func (c *ingestConfig) register(fs *flag.FlagSet) {
	c.out.register(fs)
	fs.IntVar(&c.engines, "engines", 4, "mock engines publishing")
	fs.IntVar(&c.events, "events", 40000, "BlockStored/BlockRemoved events in all")
	fs.IntVar(&c.perBatch, "batch", 8, "events per batch (one engine step)")
	fs.IntVar(&c.blocks, "blocks-per-event", 64, "blocks per BlockStored")
	fs.IntVar(&c.blockSize, "block-size", 16, "tokens per block")
	fs.Float64Var(&c.removes, "remove-ratio", 0.1, "share of events that are BlockRemoved")
	fs.Float64Var(&c.drop, "drop", 0.002, "probability a live batch is dropped on the wire (repaired by replay)")
	fs.BoolVar(&c.restart, "restart", true, "restart engine 0 half way")
	fs.IntVar(&c.lanes, "lanes", 2, "indexer lanes")
	fs.Uint64Var(&c.seed, "seed", 1, "seed")
	fs.BoolVar(&c.faults, "faults", false, "inject a disconnect, a stalled replay socket, a forged sequence (engines 1, 2, 3 a third of the way) and a peer announcing a 2^62-byte frame")
	fs.IntVar(&c.memLimit, "memlimit", -1, "soft memory limit of the Go runtime in `MiB` (debug.SetMemoryLimit), as a deployed router runs with GOMEMLIMIT; -1: twice the engines' encoded batches plus 64 MiB; 0: none")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of the timed part to `file`")
	fs.StringVar(&c.memprofile, "memprofile", "", "write a heap profile to `file` when the engines are done")
}

// maxIngestTokens bounds the tokens of the events loadgen ingest encodes
// before it starts (1-3 bytes each): 2^31.
const maxIngestTokens = 1 << 31

func (c *ingestConfig) validate() error {
	switch {
	case c.memLimit < -1:
		return fmt.Errorf("-memlimit must be >= -1")
	case c.engines < 1 || c.events < 1 || c.perBatch < 1 || c.blocks < 1 || c.blockSize < 1 || c.lanes < 1:
		return fmt.Errorf("-engines, -events, -batch, -blocks-per-event, -block-size and -lanes must be >= 1")
	case c.engines > maxEngines || c.lanes > shardpool.MaxLanes || c.blockSize > serve.MaxBlockSize || c.perBatch > c.events:
		return fmt.Errorf("-engines %d, -lanes %d, -block-size %d, -batch %d: want at most %d, %d, %d and -events (%d)",
			c.engines, c.lanes, c.blockSize, c.perBatch, maxEngines, shardpool.MaxLanes, serve.MaxBlockSize, c.events)
	case c.events > maxIngestTokens/c.blocks/c.blockSize:
		return fmt.Errorf("-events %d of -blocks-per-event %d of -block-size %d tokens: want at most %d tokens in all", c.events, c.blocks, c.blockSize, maxIngestTokens)
	case c.drop < 0 || c.drop >= 1 || c.removes < 0 || c.removes >= 1:
		return fmt.Errorf("-drop and -remove-ratio must be in [0, 1)")
	}
	return c.out.validate()
}

// ingestEngine is one mock engine: its publisher and its batches, a
// deterministic stream: generated and encoded before timing (a real engine
// does both in its own process) and handed to the publisher's replay ring
// as published, then generated again for the direct build, so that nothing
// holds the batches twice.
type ingestEngine struct {
	pub     *vllm.Publisher
	seed    uint64
	n       int // batches
	restart int // batch index to restart before; -1 for none
	enc     vllm.Encoding
	pending [][]byte // encoded before timing, handed to the ring as published
	encoded int      // bytes in pending, at first
}

// memLimitFor is the soft memory limit in MiB (0 for none). Automatic, it
// is twice what the engines encoded plus 64 MiB: the live heap is those
// batches, the index (about a third of their size here) and the queues, so
// the limit leaves the collector room; below the live heap it would
// collect without end.
func (c *ingestConfig) memLimitFor(engs []*ingestEngine) int {
	if c.memLimit >= 0 {
		return c.memLimit
	}
	return 2*encodedBytes(engs)>>20 + 64
}

// encodedBytes is how much the engines encoded before timing: held by the
// harness, as engines in their own processes would hold it.
func encodedBytes(engs []*ingestEngine) int {
	n := 0
	for _, e := range engs {
		n += e.encoded
	}
	return n
}

// batches calls f with each batch in order (restarted reports the batch
// the engine restarts before); f returning false stops.
func (e *ingestEngine) batches(c *ingestConfig, f func(b int, restarted bool, evs []vllm.Event) bool) {
	gen := vllm.NewSynthEngine(e.seed, c.blockSize, c.blocks, c.removes)
	for b := range e.n {
		if b == e.restart {
			gen.Restart()
		}
		evs := make([]vllm.Event, c.perBatch)
		for k := range evs {
			evs[k] = gen.Step()
		}
		if !f(b, b == e.restart, evs) {
			return
		}
	}
}

// runIngest: mock vLLM engines publish over ZeroMQ on loopback into the
// subscriber and a pool indexer; the final index is checked against one
// built directly from the same events.
func runIngest(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	fs := newFlags("ingest", stderr)
	var c ingestConfig
	c.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	prof, err := createProfiles(c.cpuprofile, c.memprofile)
	if err != nil {
		return err
	}
	defer prof.close()
	intr, release := watch(stop)
	defer release()
	engs, err := c.startEngines(intr)
	defer func() {
		for _, e := range engs {
			e.pub.Close()
		}
	}()
	if err != nil {
		return err
	}
	limit := c.memLimitFor(engs)
	if limit > 0 {
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(int64(limit) << 20))
	}
	decodeNs, batchBytes, err := c.measureDecode(engs[0])
	if err != nil {
		return err
	}
	pool := shardpool.NewPool(c.lanes, c.blockSize)
	defer pool.Close()
	var hostile *hostilePeer
	if c.faults {
		if hostile, err = newHostilePeer(); err != nil {
			return err
		}
		defer hostile.close()
	}
	sub, err := c.subscribe(pool, engs, hostile, intr)
	if err != nil {
		return err
	}
	defer sub.Close()
	run := &ingestRun{c: &c, engs: engs, sub: sub, intr: intr}
	stopProfile, err := prof.cpu.startCPU()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := run.publish(); err != nil {
		return err
	}
	if err := sub.Flush(); err != nil {
		return err
	}
	stopProfile()
	if err := prof.mem.writeHeap(); err != nil {
		return err
	}
	res := c.result(run, pool, time.Since(start), decodeNs)
	res.Command = commandLine("ingest", args)
	res.PayloadMB, res.MemLimitMiB, res.PeakRSSMB = float64(encodedBytes(engs))/1e6, limit, float64(rss.Peak())/1e6
	if err := c.out.write(stdout, res, func() { printIngest(stdout, res, batchBytes) }, func() { printIngestBench(stdout, res) }); err != nil {
		return err
	}
	for _, l := range sub.Stats().RecentLosses {
		fmt.Fprintln(stderr, "loss:", l)
	}
	if intr.Load() {
		return errInterrupted
	}
	if !res.IndexEqual && res.GapsLost == 0 {
		return fmt.Errorf("ingest: the final index differs although no loss was counted: %s", res.IndexDiff)
	}
	return nil
}

// batchesPerEngine is how many batches each engine publishes.
func (c *ingestConfig) batchesPerEngine() int {
	return (c.events/c.engines + c.perBatch - 1) / c.perBatch
}

// startEngines binds a publisher per engine (array encoding and legacy
// replay framing, map encoding and topic framing, alternating) and
// generates its batches (an interrupt cuts them short); engine 0 restarts
// half way if asked. Each keeps vLLM's default replay ring (10,000
// batches): the ring shares the encoded batches, so it costs no memory, and
// a smaller one would be overrun by a subscriber whose queue runs a
// thousand batches behind (losses, counted, in longer runs).
func (c *ingestConfig) startEngines(intr *interrupt) ([]*ingestEngine, error) {
	n := c.batchesPerEngine()
	var engs []*ingestEngine
	for i := range c.engines {
		enc, framing := vllm.ArrayEncoding, vllm.FramingLegacy
		if i%2 == 1 {
			enc, framing = vllm.MapEncoding, vllm.FramingTopic
		}
		pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
			Topic: fmt.Sprintf("kv@engine-%d@model", i), Encoding: enc, Framing: framing})
		if err != nil {
			return engs, err
		}
		e := &ingestEngine{pub: pub, seed: c.seed + uint64(i), n: n, restart: -1, enc: enc}
		if c.restart && i == 0 {
			e.restart = n / 2
		}
		engs = append(engs, e)
		e.pending = make([][]byte, 0, n)
		var buf []byte
		e.batches(c, func(_ int, _ bool, evs []vllm.Event) bool {
			buf = vllm.AppendBatch(buf[:0], &vllm.Batch{Events: evs}, enc)
			e.pending = append(e.pending, bytes.Clone(buf)) // exact size: no spare capacity held
			e.encoded += len(buf)
			return !intr.Load()
		})
	}
	debug.FreeOSMemory() // the events are garbage now; only the payloads stay
	return engs, nil
}

// measureDecode times decoding e's first 200 batches (in e's encoding),
// five times over: ns per event, and the mean payload size.
func (c *ingestConfig) measureDecode(e *ingestEngine) (float64, int, error) {
	payloads := e.pending[:min(200, len(e.pending))]
	size := 0
	for _, p := range payloads {
		size += len(p)
	}
	t0 := time.Now()
	decoded := 0
	for range 5 {
		for _, p := range payloads {
			b, err := vllm.DecodeBatch(p)
			if err != nil {
				return 0, 0, err
			}
			decoded += len(b.Events)
		}
	}
	return float64(time.Since(t0).Nanoseconds()) / float64(max(decoded, 1)), size / max(1, len(payloads)), nil
}

// subscribe connects a subscriber to every engine and waits out PUB/SUB's
// slow-joiner start with empty batches.
func (c *ingestConfig) subscribe(pool *shardpool.Pool, engs []*ingestEngine, hostile *hostilePeer, intr *interrupt) (*vllm.Subscriber, error) {
	eps := make([]vllm.Endpoint, len(engs))
	for i, e := range engs {
		eps[i] = vllm.Endpoint{Worker: kvevent.WorkerID(i), Address: e.pub.Addr(), Replay: e.pub.ReplayAddr(), Topic: fmt.Sprintf("kv@engine-%d@", i)}
	}
	if hostile != nil {
		eps = append(eps, vllm.Endpoint{Worker: kvevent.WorkerID(len(engs)), Address: hostile.addr()})
	}
	sub, err := vllm.NewSubscriber(pool, vllm.SubscriberConfig{BlockSize: c.blockSize}, eps...)
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		ready := true
		for i, got := range sub.Received()[:len(engs)] {
			if got == 0 {
				ready = false
				if _, err := engs[i].pub.Publish(nil); err != nil {
					sub.Close()
					return nil, err
				}
			}
		}
		switch {
		case ready:
			return sub, nil
		case time.Now().After(deadline):
			sub.Close()
			return nil, fmt.Errorf("ingest: the subscriber did not connect")
		case !intr.sleep(5 * time.Millisecond):
			return sub, nil // interrupted: the run stops at once
		}
	}
}

// ingestRun is the timed part: engines publishing, the subscriber
// catching up.
type ingestRun struct {
	c         *ingestConfig
	engs      []*ingestEngine
	sub       *vllm.Subscriber
	intr      *interrupt
	dropped   atomic.Int64
	restarted atomic.Uint64
}

// publish has every engine publish its batches, dropping some on the wire,
// and waits until the subscriber has applied them all.
func (r *ingestRun) publish() error {
	var wg sync.WaitGroup
	errs := make([]error, len(r.engs))
	for i, e := range r.engs {
		rng := rand.New(rand.NewPCG(r.c.seed, uint64(i)))
		e.pub.DropLive = func(uint64) bool {
			if rng.Float64() < r.c.drop {
				r.dropped.Add(1)
				return true
			}
			return false
		}
		wg.Go(func() { errs[i] = r.engine(i, e) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// engine publishes e's batches in order, restarting where asked, then
// waits for the subscriber.
func (r *ingestRun) engine(i int, e *ingestEngine) error {
	var seq uint64
	for b, payload := range e.pending {
		if r.intr.Load() {
			return nil
		}
		if b == e.restart {
			// Let the subscriber catch up first: a restart empties the
			// replay ring, so gaps still open would be lost for real.
			r.caughtUp(i, seq)
			e.pub.Restart()
			r.restarted.Add(1)
		}
		if b == e.n-1 {
			e.pub.DropLive = nil // a final drop would stay unseen
		}
		if r.c.faults && b == e.n/3 {
			if err := r.inject(i, e, seq); err != nil {
				return err
			}
		}
		s, err := e.pub.PublishPayload(payload)
		if err != nil {
			return err
		}
		seq, e.pending[b] = s, nil
	}
	r.caughtUp(i, seq)
	return nil
}

// inject makes engine i's fault (-faults), after batch seq: engine 1
// disconnects (its live socket closes and binds again; the engine waits for
// its subscriber to be back, so the gap fits in its ring), engine 2's replay
// socket stalls every answer half a second and its next batch is lost on
// the wire (so a replay must wait), engine 3 sends a batch under a forged
// sequence (2^63).
func (r *ingestRun) inject(i int, e *ingestEngine, seq uint64) error {
	switch i % 4 {
	case 1:
		if err := e.pub.Rebind(); err != nil {
			return err
		}
		r.caughtUp(i, seq)
	case 2:
		e.pub.ReplayDelay.Store(int64(500 * time.Millisecond))
		drop, once := e.pub.DropLive, true
		e.pub.DropLive = func(seq uint64) bool {
			if once {
				once = false
				return true
			}
			return drop != nil && drop(seq)
		}
	case 3:
		return e.pub.PublishAt(1<<63, []vllm.Event{{Type: vllm.BlockRemoved, BlockHashes: []uint64{1}}})
	}
	return nil
}

// caughtUp waits until the subscriber applied engine i's batches up to
// seq. A dropped last batch would go unseen (a gap shows only when a later
// batch arrives), so after a quiet spell it publishes an empty heartbeat
// batch that reveals it.
//
// Received is per sequence, and an engine's sequence starts again at its
// restart: until the subscriber has seen the restart, the count it reports
// is the old life's, so waiting also needs every restart made so far to
// have been seen. The restarts are read first: the subscriber resets
// Received before counting a restart.
func (r *ingestRun) caughtUp(i int, seq uint64) {
	pub := r.engs[i].pub
	behind := func() bool { return r.sub.Stats().Restarts < r.restarted.Load() || r.sub.Received()[i] <= seq }
	for quiet := 0; behind(); quiet++ {
		if !r.intr.sleep(time.Millisecond) {
			return
		}
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

// directHoldings is what an index built directly from every event the
// engines produced, restarts included, would hold (holdings.Set
// applies the events itself: no index, no dump).
func (c *ingestConfig) directHoldings(engs []*ingestEngine) holdings.Set {
	want := holdings.Set{}
	for i, e := range engs {
		conv := vllm.NewConverter(kvevent.WorkerID(i), c.blockSize)
		e.batches(c, func(_ int, restarted bool, evs []vllm.Event) bool {
			if restarted {
				_ = want.Apply(kvevent.RouterEvent{WorkerID: kvevent.WorkerID(i), Event: kvevent.Event{Data: kvevent.Cleared{}}})
			}
			for _, ev := range conv.Convert(nil, &vllm.Batch{Events: evs}) {
				_ = want.Apply(ev)
			}
			return true
		})
	}
	return want
}

// result counts and checks the final index against the direct build.
func (c *ingestConfig) result(r *ingestRun, pool *shardpool.Pool, elapsed time.Duration, decodeNs float64) ingestResult {
	st := r.sub.Stats()
	total := c.batchesPerEngine() * c.perBatch * len(r.engs)
	res := ingestResult{
		Engines: len(r.engs), Events: total, Batches: c.batchesPerEngine() * len(r.engs), BlocksPerEvent: c.blocks, BlockSize: c.blockSize,
		ElapsedS: elapsed.Seconds(), EventsS: float64(total) / elapsed.Seconds(),
		BlocksS:       float64(st.Convert.Stored) * float64(c.blocks) / elapsed.Seconds(),
		DecodeNsEvent: decodeNs, DroppedBatches: int(r.dropped.Load()),
		GapsFound: st.GapsFound, GapsRepaired: st.GapsRepaired, GapsLost: st.GapsLost, BatchesLost: st.BatchesLost,
		Replayed: st.Replayed, Restarts: st.Restarts, Rejected: st.Convert.Rejected() + pool.Stats().Rejected(),
		Disconnects: st.Disconnects, FramesRefused: st.FramesRefused, SuspectSeqs: st.SuspectSeqs, Faults: c.faults,
		Interrupted: r.intr.Load(),
	}
	if res.Interrupted {
		res.IndexDiff = "interrupted"
		return res
	}
	for _, e := range r.engs {
		e.pub.Close() // their replay rings are not needed any more
	}
	want := c.directHoldings(r.engs)
	res.IndexDiff = want.DiffIndex(pool.Index())
	res.IndexEqual = res.IndexDiff == ""
	return res
}

func printIngest(w io.Writer, res ingestResult, batchBytes int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "engines\t%d (array+legacy replay framing, map+topic framing alternating)\n", res.Engines)
	fmt.Fprintf(tw, "events\t%d in %d batches, %d blocks of %d tokens per BlockStored\n", res.Events, res.Batches, res.BlocksPerEvent, res.BlockSize)
	fmt.Fprintf(tw, "end to end\t%.0f events/s, %.0f blocks/s (%.2fs)\n", res.EventsS, res.BlocksS, res.ElapsedS)
	fmt.Fprintf(tw, "decode\t%.0f ns/event (%d-byte batches)\n", res.DecodeNsEvent, batchBytes)
	fmt.Fprintf(tw, "gaps\t%d batches dropped on the wire; %d gaps found, %d repaired (%d batches replayed), %d lost (%d batches)\n",
		res.DroppedBatches, res.GapsFound, res.GapsRepaired, res.Replayed, res.GapsLost, res.BatchesLost)
	fmt.Fprintf(tw, "restarts\t%d\n", res.Restarts)
	fmt.Fprintf(tw, "faults\t%v: %d disconnects, %d frames refused, %d suspect sequences\n", res.Faults, res.Disconnects, res.FramesRefused, res.SuspectSeqs)
	fmt.Fprintf(tw, "rejected\t%d events\n", res.Rejected)
	limit := "none"
	if res.MemLimitMiB > 0 {
		limit = fmt.Sprintf("%d MiB", res.MemLimitMiB)
	}
	fmt.Fprintf(tw, "memory\tpeak RSS %.0f MB (soft limit %s); the engines' encoded batches, held by the harness: %.0f MB\n", res.PeakRSSMB, limit, res.PayloadMB)
	fmt.Fprintf(tw, "final index\tequal to the direct build: %v %s\n", res.IndexEqual, res.IndexDiff)
	tw.Flush()
}

func printIngestBench(w io.Writer, res ingestResult) {
	fmt.Fprintf(w, "pkg: github.com/kvradix/kvradix/cmd/loadgen\nBenchmarkIngest/engines=%d/blocks=%d 1 %.0f ns/op %.0f events/s %.0f blocks/s %.0f decode-ns/event %.0f peak-RSS-MB\n",
		res.Engines, res.BlocksPerEvent, res.ElapsedS*1e9, res.EventsS, res.BlocksS, res.DecodeNsEvent, res.PeakRSSMB)
}

// hostilePeer is an "engine" that greets like a PUB, then announces a
// frame of 2^62 bytes (-faults); it does so on every connection.
type hostilePeer struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newHostilePeer() (*hostilePeer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hostilePeer{ln: ln}
	h.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.wg.Go(func() { h.serve(c) })
		}
	})
	return h, nil
}

func (h *hostilePeer) addr() string { return "tcp://" + h.ln.Addr().String() }

// serve writes a ZMTP 3.0 NULL greeting, a READY for a PUB, then the header
// of a frame claiming 2^62 bytes, and waits for the other side to hang up.
func (h *hostilePeer) serve(c net.Conn) {
	defer c.Close()
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xFF, 0x7F, 3
	copy(greeting[12:], "NULL")
	ready := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")
	msg := append(append(greeting, 0x04, byte(len(ready))), ready...)
	if _, err := c.Write(msg); err != nil {
		return
	}
	time.Sleep(100 * time.Millisecond)
	_, _ = c.Write(binary.BigEndian.AppendUint64([]byte{0x02}, 1<<62))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.Copy(io.Discard, c)
}

func (h *hostilePeer) close() {
	h.ln.Close()
	h.wg.Wait()
}
