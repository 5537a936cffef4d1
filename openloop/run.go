package openloop

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvradix/kvradix/internal/rss"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/shardpool"
)

// The run is the reference's drain-correct protocol (mooncake_bench): the
// corpus is built outside timing, its operations are issued by absolute
// deadline, and the run is timed from the first deadline to the
// completion of the last query and the last event, the drain included.
//
// Issuers never spin on the clock: each sleeps until its next deadline,
// then issues every operation whose deadline has passed (a deadline
// group), so that the cores are left to the index. Events go through an
// unbounded FIFO per issuer (a feeder) to the indexer, so that an
// indexer's back-pressure delays events, not the issuer: the reference's
// indexers accept into unbounded channels. Queries go to query lanes,
// each running lookups one after the other.

// Protocol is how a run issues the corpus.
type Protocol struct {
	Issuers    int `json:"issuers"`     // goroutines issuing by deadline, each with its feeder
	QueryLanes int `json:"query_lanes"` // goroutines running lookups
}

// RunFresh collects garbage, builds a fresh indexer of im for the corpus's
// block size and runs the corpus against it.
func RunFresh(c *Corpus, im shardpool.Impl, p Protocol, stop <-chan struct{}) *Result {
	runtime.GC()
	start := time.Now()
	idx := im.New(int(c.BlockSize))
	built := time.Since(start)
	r := Run(c, idx, im, p, stop)
	r.IndexBuildNs = built.Nanoseconds()
	return r
}

// Run issues the corpus against idx (an indexer of im) by the protocol,
// closes idx and returns the run's result. A closed stop ends the issue
// early: the result is marked interrupted, neither kept up nor valid.
func Run(c *Corpus, idx shardpool.Indexer, im shardpool.Impl, p Protocol, stop <-chan struct{}) *Result {
	c = c.positional()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	defer idx.Close()
	s := &runState{c: c, idx: idx, stop: stop, clockRead: clockRead(), acceptedAt: make([]int64, len(c.Ops)), appliedAt: make([]int64, len(c.Ops)),
		lag: make([][]time.Duration, p.Issuers), readLag: make([][]time.Duration, p.Issuers),
		wait: make([][]time.Duration, p.QueryLanes), service: make([][]time.Duration, p.QueryLanes), finished: make([][]time.Duration, p.QueryLanes)}
	idx.Observe(func(ev kvevent.RouterEvent, err error) {
		s.appliedAt[ev.Event.ID-1] = s.since()
		if err != nil {
			s.failed.Add(1)
		}
	})
	parts := c.partition(p.Issuers)
	s.totals = c.Totals()
	// Every lane can queue every query: a query goes to the lane of its
	// position, which need not spread them evenly, and an issuer must never
	// wait on a lane.
	s.lanes = make([]chan queued, p.QueryLanes)
	for i := range s.lanes {
		s.lanes[i] = make(chan queued, int(s.totals.Requests)+1)
	}
	s.feeders = make([]*feeder, len(parts))
	var lanes, feeders, issuers sync.WaitGroup
	use0, host0 := rss.Process(), rss.Host()
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
	st := stopState{stopped: s.since(), events: idx.Stats().QueueDepth}
	for _, f := range s.feeders {
		st.events += f.close()
	}
	st.depth = st.events
	for _, l := range s.lanes {
		st.depth += len(l)
		close(l)
	}
	feeders.Wait()
	lanes.Wait()
	_, _ = idx.Flush()
	st.end = s.since()
	st.use, st.host = rss.Process().Minus(use0), rss.Host().Minus(host0)
	return s.result(im, before, st)
}

// stopState is what a run measured when its issuers stopped and when it
// ended.
type stopState struct {
	stopped, end  int64         // ns from start
	events, depth int           // events queued when the issuers stopped; events and queries
	use           rss.Usage     // the process's over the run
	host          rss.HostUsage // the machine's over the run
}

// runState is one run's measurements; each issuer and lane writes only its
// own slices (and distinct elements of the shared ones).
type runState struct {
	c          *Corpus
	totals     Totals
	idx        shardpool.Indexer
	start      time.Time
	stop       <-chan struct{}
	acceptedAt []int64           // ns from start, per op: the event handed to its feeder
	appliedAt  []int64           // ns from start, per op: the event applied
	lag        [][]time.Duration // per issuer, every operation
	readLag    [][]time.Duration // per issuer, queries only
	wait       [][]time.Duration // per lane: queued to started
	service    [][]time.Duration // per lane: started to answered
	finished   [][]time.Duration // per lane: a query's deadline to its answer
	lastIssue  atomic.Int64      // ns from start
	harnessCPU atomic.Int64      // ns of CPU the issuers and feeders used (their threads' clocks)
	clockRead  int64             // ns of CPU a reading of a thread's clock costs, measured as the run starts (see work)
	issued     atomic.Int64
	failed     atomic.Int64 // operations that returned an error
	lanes      []chan queued
	feeders    []*feeder
}

type queued struct {
	op  int32
	enq int64 // ns from start
}

func (s *runState) since() int64 { return int64(time.Since(s.start)) }

// partition gives each worker's operations, in order, to one issuer.
func (c *Corpus) partition(issuers int) [][]int32 {
	parts := make([][]int32, issuers)
	for i := range c.Ops {
		k := int(uint64(c.Ops[i].Worker) % uint64(issuers))
		parts[k] = append(parts[k], int32(i))
	}
	return parts
}

// feeder is one issuer's unbounded FIFO of accepted events.
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

// close ends f once it is empty and returns how many events it held.
func (f *feeder) close() int {
	f.mu.Lock()
	n := len(f.q)
	f.closed = true
	f.mu.Unlock()
	f.cond.Signal()
	return n
}

// feed applies what f accepts, in order, until f is closed and empty.
func (s *runState) feed(f *feeder) {
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
		t0 := s.work()
		for _, i := range batch {
			op := &s.c.Ops[i]
			if s.idx.ApplyEvent(kvevent.RouterEvent{WorkerID: op.Worker, Event: op.Event}) != nil {
				s.failed.Add(1)
			}
		}
		s.rest(t0)
	}
}

// work marks the start of a stretch of the harness's work on the calling
// goroutine: it locks the goroutine to its thread, so that the thread's
// CPU clock measures the stretch, and returns the clock. rest ends the
// stretch, adding its CPU to the harness's. The harness's goroutines are
// locked only while they work, never while they wait: a locked goroutine
// that blocks hands its processor to another thread and back, which cost
// more than the issue itself.
//
// The two readings of the clock are the harness's work too: each is a
// system call (no vDSO serves a thread's CPU clock), 1.3 µs on our VM, and
// the stretch between them misses the part of the first call before its
// reading and the part of the second after its, about one call. rest
// charges that call to the harness as well (runState.clockRead), or a
// harness working in many short stretches would lend the lanes its
// clock's cost. The call's cost is measured as the run starts, not once a
// process: measured once, on a machine that got busier since, it charged
// three quarters of the clock's cost (TestStretchesChargeTheirClock under
// CI's load, as if a reading had come to cost twice what it did).
func (s *runState) work() int64 {
	runtime.LockOSThread()
	return threadCPU()
}

func (s *runState) rest(t0 int64) {
	s.harnessCPU.Add(threadCPU() - t0 + s.clockRead)
	runtime.UnlockOSThread()
}

// clockRead measures the CPU one reading of the thread's clock costs: the
// least mean of five batches of 200 readings back to back (about 1.3 ms
// in all), so that a batch the machine interrupted does not count. A mean
// of all thousand once charged every stretch of a run 1.6 times what it
// cost (TestStretchesChargeTheirClock, in CI).
func clockRead() int64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const batches, n = 5, 200
	least := int64(math.MaxInt64)
	for range batches {
		t0 := threadCPU()
		for range n - 1 {
			threadCPU()
		}
		least = min(least, (threadCPU()-t0)/n)
	}
	return least
}

// issue issues the operations of part by deadline group. An operation's
// lag is how late it went out.
func (s *runState) issue(k int, part []int32) {
	lag := make([]time.Duration, 0, len(part))
	var readLag []time.Duration
	defer func() { s.lag[k], s.readLag[k] = lag, readLag }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for n := 0; n < len(part); {
		if d := time.Duration(int64(s.c.Ops[part[n]].Deadline) - s.since()); d > 0 {
			timer.Reset(d)
			select {
			case <-s.stop:
				return
			case <-timer.C:
			}
		} else if closed(s.stop) {
			return
		}
		t0 := s.work()
		now := s.since()
		for ; n < len(part) && int64(s.c.Ops[part[n]].Deadline) <= now; n++ {
			i := part[n]
			op := &s.c.Ops[i]
			lag = append(lag, time.Duration(now-int64(op.Deadline)))
			if op.IsQuery() {
				readLag = append(readLag, lag[len(lag)-1])
				s.lanes[int(i)%len(s.lanes)] <- queued{i, now}
			} else {
				s.acceptedAt[i] = now
				s.feeders[k].push(i)
			}
			s.issued.Add(1)
		}
		storeMax(&s.lastIssue, now)
		s.rest(t0)
	}
}

// serve runs lane l's queries: through the indexer's AppendMatches where
// it has one (a pool; allocation-free over the compressed tree), or else
// FindMatches. A lookup's answer is the same either way, but FindMatches'
// maps (12 KB a lookup on the trace) turn the run into a garbage
// collector's benchmark, whose cycles keep the issuers off the cores.
func (s *runState) serve(l int) {
	var wait, service, finished []time.Duration
	app, _ := s.idx.(matchAppender)
	var buf []radix.Match
	for q := range s.lanes[l] {
		t0 := s.since()
		wait = append(wait, time.Duration(t0-q.enq))
		var err error
		if app != nil {
			buf, err = app.AppendMatches(buf[:0], s.c.Ops[q.op].Query)
		} else {
			_, err = s.idx.FindMatches(s.c.Ops[q.op].Query)
		}
		if err != nil {
			s.failed.Add(1)
		}
		t1 := s.since()
		service = append(service, time.Duration(t1-t0))
		finished = append(finished, time.Duration(t1-int64(s.c.Ops[q.op].Deadline)))
	}
	s.wait[l], s.service[l], s.finished[l] = wait, service, finished
}

// matchAppender is an indexer that matches into a caller's buffer
// (shardpool.Pool).
type matchAppender interface {
	AppendMatches(dst []radix.Match, local []uint64) ([]radix.Match, error)
}

func storeMax(m *atomic.Int64, v int64) {
	for old := m.Load(); v > old && !m.CompareAndSwap(old, v); old = m.Load() {
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// updates returns the applied events' latencies: accepted to applied,
// deadline to applied, and deadline to accepted (the issue lag).
func (s *runState) updates() (accepted, scheduled, lag []time.Duration) {
	for i := range s.c.Ops {
		if !s.c.Ops[i].IsQuery() && s.appliedAt[i] > 0 {
			at := int64(s.c.Ops[i].Deadline)
			accepted = append(accepted, time.Duration(s.appliedAt[i]-s.acceptedAt[i]))
			scheduled = append(scheduled, time.Duration(s.appliedAt[i]-at))
			lag = append(lag, time.Duration(s.acceptedAt[i]-at))
		}
	}
	return accepted, scheduled, lag
}

// result applies the validity rules and summarises the run in Dynamo's
// result JSON with kvradix's keys.
func (s *runState) result(im shardpool.Impl, before runtime.MemStats, st stopState) *Result {
	c := s.c
	stats := s.idx.Stats()
	// Twice: arrays the index recycles through a sync.Pool survive one
	// collection in the pool's victim cache, and are not the index's.
	runtime.GC()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	update, updateFinished, updateLag := s.updates()
	window := c.ReferenceWindow
	issuedAll := s.issued.Load() == int64(len(c.Ops))
	r := &Result{
		SchemaVersion: SchemaVersion, Backend: "kvradix-" + indexName(im), Timer: "monotonic",
		BenchmarkDurationMs: uint64(window.Milliseconds()), BlockSize: c.BlockSize,
		QueryLanes: len(s.lanes), IssuerThreads: len(s.lag), EventWorkers: max(im.Lanes, 1),
		IssuerCPUs: []int{}, BackendCPUs: []int{}, GeneratorGate: "deadline-groups",
		ReadIssueLag: Dist(s.readLag...), UpdateIssueLag: Dist(updateLag),
		QueryQueueWait: Dist(s.wait...), QueryService: Dist(s.service...),
		QueryScheduledToFinished: Dist(s.finished...), UpdateAcceptedToFinished: Dist(update),
		UpdateScheduledToFinished: Dist(updateFinished),
		QueueDepthAtStop:          []int{st.depth}, OutstandingUpdatesAtStop: st.events,
		IssuerCPUNs: s.harnessCPU.Load(), HarnessClockReadNs: s.clockRead, IssueSpanNs: s.lastIssue.Load(), DrainNs: st.end - st.stopped,
		FailureReasons: []string{},
		Index:          indexName(im), Lanes: im.Lanes, ElapsedNs: st.end, Pairs: stats.Pairs, RejectedEvents: stats.Rejected(),
		Interrupted: !issuedAll,
	}
	r.SetTotals(s.totals, window)
	if r.TotalEvents > 0 {
		r.EventsQueuedFraction = float64(st.events) / float64(r.TotalEvents)
	}
	if sec := time.Duration(st.end).Seconds(); sec > 0 && issuedAll {
		r.AchievedLogicalOpsPerSec, r.AchievedBlockOpsPerSec = float64(r.TotalLogicalOps)/sec, float64(r.TotalBlockOps)/sec
	}
	if sec := time.Duration(r.IssueSpanNs).Seconds(); sec > 0 {
		r.ActualIssueLogicalOpsPerSec = float64(s.issued.Load()) / sec
		r.ActualIssueBlockOpsPerSec = float64(r.TotalBlockOps) / sec
	}
	r.GeneratorValid = issuedAll && float64(r.IssueSpanNs) <= 1.01*float64(window) && s.failed.Load() == 0 && stats.Rejected() == 0
	r.KeptUp = issuedAll && float64(st.end) <= 1.10*float64(window)
	if !r.GeneratorValid {
		r.FailureReasons = append(r.FailureReasons, "generator_invalid")
	}
	if !r.KeptUp {
		r.FailureReasons = append(r.FailureReasons, "not_kept_up")
	}
	if st.end > 0 {
		r.IssuerCPUFraction = float64(r.IssuerCPUNs) / (float64(st.end) * float64(runtime.GOMAXPROCS(0)))
	}
	r.ProcessSysCPUNs, r.PageFaults = st.use.SysNs, st.use.Faults
	r.HostIdleFraction, r.HostStealFraction, r.HostOtherFraction = st.host.IdleFraction(), st.host.StealFraction(), st.host.OtherFraction(st.use)
	if lane := st.use.CPUNs - r.IssuerCPUNs; lane > 0 {
		r.LaneCPUNs = lane
		r.AchievedBlockOpsPerLaneCPU = float64(r.TotalBlockOps) / (float64(lane) / 1e9)
	}
	if stats.Pairs > 0 {
		r.BytesPerPair = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(stats.Pairs)
	}
	return r
}

// indexName is the result's name of an indexer: its Impl's, "-sized" for a
// table sized up front.
func indexName(im shardpool.Impl) string {
	if im.Blocks > 0 {
		return im.Name + "-sized"
	}
	return im.Name
}
