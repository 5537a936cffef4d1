package main

import (
	"cmp"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/replay"
	"github.com/kvradix/kvradix/shardpool"
	"github.com/kvradix/kvradix/trace"
)

// The indexer protocol is the reference's drain-correct replay
// (mooncake_bench): a corpus of timed operations is built outside timing,
// issued by absolute deadline, and timed from the first deadline to the
// completion of the last query and the last event, the drain included.

// corpusConfig is how the corpus is built. Its JSON is the provenance of
// every result.
type corpusConfig struct {
	Trace          string `json:"trace"`
	Workers        int    `json:"workers"`          // simulated engines, before -dup
	BlockSize      int    `json:"block_size"`       // tokens per KV block
	TraceBlockSize int    `json:"trace_block_size"` // tokens per trace hash id
	Blocks         int    `json:"blocks"`           // KV blocks per engine
	Dup            int    `json:"dup"`              // copies in disjoint hash spaces, each with its own workers
	LengthFactor   int    `json:"length_factor"`    // each hash id stretched into this many
	Seed           uint64 `json:"seed"`             // request-to-engine spread
}

func (c corpusConfig) validate() error {
	switch {
	case c.Workers < 1:
		return fmt.Errorf("-workers %d, want >= 1", c.Workers)
	case c.Dup < 1:
		return fmt.Errorf("-dup %d, want >= 1", c.Dup)
	case c.LengthFactor < 1 || c.LengthFactor > 64:
		return fmt.Errorf("-length-factor %d, want in [1, 64]", c.LengthFactor)
	case c.TraceBlockSize < 1 || c.TraceBlockSize > 1<<16:
		return fmt.Errorf("-trace-block-size %d, want in [1, 65536]", c.TraceBlockSize)
	}
	return nil
}

// corpusOp is one timed operation: a request's lookup or a KV event.
type corpusOp struct {
	at     time.Duration // deadline from the start
	worker kvevent.WorkerID
	query  []uint64 // local hashes of a request; nil for an event
	ev     kvevent.Event
}

func (o *corpusOp) isQuery() bool { return o.query != nil }

// class orders operations at one deadline: queries before writes.
func (o *corpusOp) class() int {
	if o.isQuery() {
		return 0
	}
	return 1
}

// corpus is every operation of a run, merged by deadline.
type corpus struct {
	cfg    corpusConfig
	window time.Duration
	ops    []corpusOp
	// Counters: logical ops are requests + Stored + Removed + Cleared; block
	// ops are request hashes + hashes in Stored and Removed events.
	requests, stored, removed, cleared int
	blockOps                           int64
	workers                            int // after -dup
}

func (c *corpus) logicalOps() int { return c.requests + c.stored + c.removed + c.cleared }

// buildCorpus stretches the requests, runs them through the mock engines,
// makes the copies, normalises each worker's timeline to start at zero and
// rescales it to the window, and merges the whole by deadline, class
// (queries before writes), worker and source order. Event ids become the
// operation's position, so they are unique and rise along each worker.
func buildCorpus(reqs []trace.Request, cc corpusConfig, window time.Duration) (*corpus, error) {
	if err := cc.validate(); err != nil {
		return nil, err
	}
	stretched := make([]trace.Request, len(reqs))
	for i, r := range reqs {
		stretched[i] = trace.Stretch(r, cc.LengthFactor, cc.TraceBlockSize)
	}
	rc := replay.DefaultConfig()
	rc.Workers, rc.BlockSize, rc.TraceBlockSize, rc.Blocks, rc.Seed = cc.Workers, cc.BlockSize, cc.TraceBlockSize, cc.Blocks, cc.Seed
	src, err := replay.Workload(stretched, rc)
	if err != nil {
		return nil, err
	}
	src = duplicate(src, cc.Dup, cc.Workers)
	c := &corpus{cfg: cc, window: window, workers: cc.Workers * cc.Dup, ops: make([]corpusOp, len(src))}
	first := make(map[kvevent.WorkerID]float64, c.workers)
	last := make(map[kvevent.WorkerID]float64, c.workers)
	for _, op := range src {
		if t, ok := first[op.Worker]; !ok || op.T < t {
			first[op.Worker] = op.T
		}
		last[op.Worker] = max(last[op.Worker], op.T)
	}
	for i, op := range src {
		o := &c.ops[i]
		o.worker, o.query, o.ev = op.Worker, op.Match, op.Event
		if span := last[op.Worker] - first[op.Worker]; span > 0 {
			o.at = time.Duration((op.T - first[op.Worker]) / span * float64(window))
		}
		c.count(o)
	}
	// A stable sort keeps source order among equal keys; src is in time
	// order, so every worker's operations stay in their order.
	slices.SortStableFunc(c.ops, func(a, b corpusOp) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.class(), b.class()), cmp.Compare(a.worker, b.worker))
	})
	for i := range c.ops {
		if !c.ops[i].isQuery() {
			c.ops[i].ev.ID = uint64(i) + 1
		}
	}
	return c, nil
}

func (c *corpus) count(o *corpusOp) {
	if o.isQuery() {
		c.requests++
		c.blockOps += int64(len(o.query))
		return
	}
	switch d := o.ev.Data.(type) {
	case kvevent.Stored:
		c.stored++
		c.blockOps += int64(len(d.Blocks))
	case kvevent.Removed:
		c.removed++
		c.blockOps += int64(len(d.BlockHashes))
	case kvevent.Cleared:
		c.cleared++
	}
}

// protocol is how a run issues the corpus.
type protocol struct {
	Issuers    int `json:"issuers"`     // goroutines issuing by deadline
	QueryLanes int `json:"query_lanes"` // goroutines running FindMatches
}

// runState is one run's measurements; each issuer and lane writes only its
// own slices (and distinct elements of the shared ones).
type runState struct {
	c          *corpus
	idx        shardpool.Indexer
	start      time.Time
	stop       <-chan struct{}
	acceptedAt []int64           // ns from start, per op: the event handed to the indexer
	appliedAt  []int64           // ns from start, per op: the event applied
	lag        [][]time.Duration // per issuer, every operation
	readLag    [][]time.Duration // per issuer, queries only
	wait       [][]time.Duration
	service    [][]time.Duration
	finished   [][]time.Duration // per lane: a query's deadline to its answer
	lastIssue  atomic.Int64      // ns from start
	harnessCPU atomic.Int64      // ns of CPU the issuers and feeders used (their threads' clocks)
	issued     atomic.Int64
	failed     atomic.Int64 // operations that returned an error
	lanes      []chan queued
	feeders    []*feeder
}

// feeder accepts one issuer's events into an unbounded FIFO and hands them
// to the indexer's ApplyEvent in order, so that an indexer's back-pressure
// (its bounded queues) delays events, not the issuer: the reference's
// indexers accept into unbounded channels. Update latency counts from
// acceptance.
type feeder struct {
	mu     sync.Mutex
	cond   sync.Cond
	q      []int32
	closed bool
}

func newFeeder() *feeder {
	f := &feeder{}
	f.cond.L = &f.mu
	return f
}

func (f *feeder) push(i int32) {
	f.mu.Lock()
	f.q = append(f.q, i)
	f.mu.Unlock()
	f.cond.Signal()
}

func (f *feeder) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.cond.Signal()
}

// feed applies what f accepts, in order, until f is closed and empty.
func (s *runState) feed(f *feeder) {
	defer s.measureCPU()()
	var batch []int32
	for {
		f.mu.Lock()
		for len(f.q) == 0 && !f.closed {
			f.cond.Wait()
		}
		batch, f.q = f.q, batch[:0]
		done := f.closed && len(batch) == 0
		f.mu.Unlock()
		if done {
			return
		}
		for _, i := range batch {
			op := &s.c.ops[i]
			if s.idx.ApplyEvent(kvevent.RouterEvent{WorkerID: op.worker, Event: op.ev}) != nil {
				s.failed.Add(1)
			}
		}
	}
}

type queued struct {
	op  int32
	enq int64 // ns from start
}

func (s *runState) since() int64 { return int64(time.Since(s.start)) }

// run issues the corpus against a fresh index of im and measures it.
func (c *corpus) run(im shardpool.Impl, blockSize int, p protocol, stop <-chan struct{}) indexerResult {
	runtime.GC()
	return c.runOn(im.New(blockSize), im, p, stop)
}

// runOn issues the corpus against idx (named im), and closes it.
func (c *corpus) runOn(idx shardpool.Indexer, im shardpool.Impl, p protocol, stop <-chan struct{}) indexerResult {
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	defer idx.Close()
	s := &runState{c: c, idx: idx, stop: stop, acceptedAt: make([]int64, len(c.ops)), appliedAt: make([]int64, len(c.ops)),
		lag: make([][]time.Duration, p.Issuers), readLag: make([][]time.Duration, p.Issuers),
		wait: make([][]time.Duration, p.QueryLanes), service: make([][]time.Duration, p.QueryLanes), finished: make([][]time.Duration, p.QueryLanes)}
	idx.Observe(func(ev kvevent.RouterEvent, err error) {
		s.appliedAt[ev.Event.ID-1] = s.since()
		if err != nil {
			s.failed.Add(1)
		}
	})
	parts := c.partition(p.Issuers)
	s.lanes = make([]chan queued, p.QueryLanes)
	for i := range s.lanes {
		s.lanes[i] = make(chan queued, c.requests/p.QueryLanes+1)
	}
	s.feeders = make([]*feeder, len(parts))
	var lanes, feeders, issuers sync.WaitGroup
	cpu0 := processCPU()
	s.start = time.Now()
	for l := range s.lanes {
		lanes.Go(func() { s.serve(l) })
	}
	for i := range parts {
		s.feeders[i] = newFeeder()
		feeders.Go(func() { s.feed(s.feeders[i]) })
	}
	for i, part := range parts {
		issuers.Go(func() { s.issue(i, part) })
	}
	issuers.Wait()
	stopped := s.since()
	events := idx.Stats().QueueDepth
	for _, f := range s.feeders {
		f.mu.Lock()
		events += len(f.q)
		f.mu.Unlock()
		f.close()
	}
	depth := events
	for _, l := range s.lanes {
		depth += len(l)
		close(l)
	}
	feeders.Wait()
	lanes.Wait()
	_, _ = idx.Flush()
	end := s.since()
	cpu := processCPU() - cpu0
	r := s.result(im, before, stopped, end, depth)
	r.setLaneCPU(cpu - s.harnessCPU.Load())
	r.EventsQueuedFrac = float64(events) / float64(max(r.Events, 1))
	return r
}

// partition gives each worker's operations, in order, to one issuer.
func (c *corpus) partition(issuers int) [][]int32 {
	parts := make([][]int32, issuers)
	for i := range c.ops {
		k := int(uint64(c.ops[i].worker) % uint64(issuers))
		parts[k] = append(parts[k], int32(i))
	}
	return parts
}

// measureCPU locks the calling goroutine to its thread and returns what,
// deferred, adds the thread's CPU time since to the harness's.
func (s *runState) measureCPU() func() {
	runtime.LockOSThread()
	t0 := threadCPU()
	return func() {
		s.harnessCPU.Add(threadCPU() - t0)
		runtime.UnlockOSThread()
	}
}

// issue issues the operations of part by deadline group, never spinning on
// the clock: it sleeps until the next deadline, then issues every
// operation whose deadline has passed, so that the cores are left to the
// index (spinning took a third of two cores at high rates). An operation's
// lag is how late it went out.
func (s *runState) issue(k int, part []int32) {
	defer s.measureCPU()()
	lag := make([]time.Duration, 0, len(part))
	var readLag []time.Duration
	defer func() { s.lag[k], s.readLag[k] = lag, readLag }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for n := 0; n < len(part); {
		if d := time.Duration(int64(s.c.ops[part[n]].at) - s.since()); d > 0 {
			timer.Reset(d)
			select {
			case <-s.stop:
				return
			case <-timer.C:
			}
		} else if chanClosed(s.stop) {
			return
		}
		now := s.since()
		for ; n < len(part) && int64(s.c.ops[part[n]].at) <= now; n++ {
			i := part[n]
			op := &s.c.ops[i]
			lag = append(lag, time.Duration(now-int64(op.at)))
			if op.isQuery() {
				readLag = append(readLag, lag[len(lag)-1])
				s.lanes[int(i)%len(s.lanes)] <- queued{i, now}
			} else {
				s.acceptedAt[i] = now
				s.feeders[k].push(i)
			}
			s.issued.Add(1)
		}
		storeMax(&s.lastIssue, now)
	}
}

// serve runs lane l's queries.
func (s *runState) serve(l int) {
	var wait, service, finished []time.Duration
	for q := range s.lanes[l] {
		t0 := s.since()
		wait = append(wait, time.Duration(t0-q.enq))
		if _, err := s.idx.FindMatches(s.c.ops[q.op].query); err != nil {
			s.failed.Add(1)
		}
		t1 := s.since()
		service = append(service, time.Duration(t1-t0))
		finished = append(finished, time.Duration(t1-int64(s.c.ops[q.op].at)))
	}
	s.wait[l], s.service[l], s.finished[l] = wait, service, finished
}

func storeMax(m *atomic.Int64, v int64) {
	for old := m.Load(); v > old && !m.CompareAndSwap(old, v); old = m.Load() {
	}
}

// result applies the validity rules and summarises the run.
func (s *runState) result(im shardpool.Impl, before runtime.MemStats, stopped, end int64, depth int) indexerResult {
	c := s.c
	st := s.idx.Stats()
	// Twice: arrays the index recycles through a sync.Pool survive one
	// collection in the pool's victim cache, and are not the index's.
	runtime.GC()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	var update, updateFinished, updateLag []time.Duration
	for i := range c.ops {
		if !c.ops[i].isQuery() && s.appliedAt[i] > 0 {
			update = append(update, time.Duration(s.appliedAt[i]-s.acceptedAt[i]))
			updateFinished = append(updateFinished, time.Duration(s.appliedAt[i]-int64(c.ops[i].at)))
			updateLag = append(updateLag, time.Duration(s.acceptedAt[i]-int64(c.ops[i].at)))
		}
	}
	elapsed := time.Duration(end)
	issuedAll := s.issued.Load() == int64(len(c.ops))
	r := indexerResult{
		Impl: im.Name, Lanes: im.Lanes, DurationS: c.window.Seconds(), ElapsedS: elapsed.Seconds(),
		Ops: len(c.ops), Events: len(c.ops) - c.requests, Matches: c.requests,
		LogicalOps: c.logicalOps(), BlockOps: c.blockOps,
		OfferedOpsS:      float64(c.logicalOps()) / c.window.Seconds(),
		AchievedOpsS:     float64(s.issued.Load()) / elapsed.Seconds(),
		OfferedBlockOpsS: float64(c.blockOps) / c.window.Seconds(),
		FindMatchesUs:    latencies(s.service...),
		QueryServiceUs:   latencies(s.service...),
		QueryWaitUs:      latencies(s.wait...),
		UpdateLatencyUs:  latencies(update),
		IssueLagUs:       latencies(s.lag...),
		DrainMs:          float64(end-stopped) / 1e6,
		QueueDepthAtStop: depth,
		Pairs:            st.Pairs,
		Rejected:         st.Rejected(),
		Interrupted:      !issuedAll,
	}
	if issuedAll {
		r.AchievedBlockOpS = float64(c.blockOps) / elapsed.Seconds()
	}
	window := float64(c.window)
	r.GeneratorValid = issuedAll && float64(s.lastIssue.Load()) <= 1.01*window && s.failed.Load() == 0 && st.Rejected() == 0
	r.HarnessCPUFrac = float64(s.harnessCPU.Load()) / (float64(end) * float64(runtime.GOMAXPROCS(0)))
	r.v4 = s.v4(r, stopped, end, depth, update, updateFinished, updateLag)
	r.KeptUp = issuedAll && float64(end) <= 1.10*window
	r.Saturated = !r.KeptUp
	if st.Pairs > 0 {
		r.BytesPerPair = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(st.Pairs)
	}
	return r
}

// sweep finds the shortest window that keeps up: it halves -duration until
// a run falls behind, then bisects between the last window that kept up and
// the first that did not. The result is the run at the shortest window that
// kept up (or the longest tried, if none did), with every step.
func sweep(c0 *corpus, im shardpool.Impl, p protocol, steps int, stop <-chan struct{}, progress io.Writer) indexerResult {
	var best, last indexerResult
	var pts []sweepPt
	step := func(w time.Duration) indexerResult {
		r := c0.rescaled(w).run(im, c0.cfg.BlockSize, p, stop)
		pts = append(pts, sweepPt{OfferedOpsS: r.OfferedOpsS, AchievedOpsS: r.AchievedOpsS, OfferedBlockOpsS: r.OfferedBlockOpsS,
			AchievedBlockOpsS: r.AchievedBlockOpS, P99Us: r.QueryServiceUs.P99, Saturated: !r.KeptUp, WindowMs: w.Seconds() * 1e3})
		fmt.Fprintf(progress, "%s sweep: window %v, offered %.3gM block-ops/s, achieved %.3gM, kept up %v\n",
			im, w, r.OfferedBlockOpsS/1e6, r.AchievedBlockOpS/1e6, r.KeptUp)
		return r
	}
	lo, hi := time.Duration(0), c0.window // lo fell behind, hi kept up (once found)
	for k := 0; k < steps; k++ {
		w := hi
		if k > 0 {
			if lo == 0 {
				w = hi / 2
			} else {
				w = (lo + hi) / 2
			}
		}
		if w < 10*time.Millisecond || chanClosed(stop) {
			break
		}
		r := step(w)
		last = r
		if r.KeptUp {
			best, hi = r, w
		} else if lo = w; best.Impl == "" {
			break // the longest window already fell behind
		}
	}
	res := last
	if best.Impl != "" {
		res = best
		res.ThresholdOpsS = best.AchievedOpsS
		res.ThresholdP99Us = best.QueryServiceUs.P99
	}
	res.Sweep = pts
	return res
}

// rescaled returns c with every deadline scaled to the window w (the ops
// are shared: runs do not modify them).
func (c *corpus) rescaled(w time.Duration) *corpus {
	if w == c.window {
		return c
	}
	out := *c
	out.window = w
	out.ops = slices.Clone(c.ops)
	for i := range out.ops {
		out.ops[i].at = time.Duration(float64(c.ops[i].at) * float64(w) / float64(c.window))
	}
	return &out
}

func chanClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
