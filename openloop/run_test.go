package openloop

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/shardpool"
	"github.com/kvradix/kvradix/trace"
)

func smallCorpus(t *testing.T, dup, lf int, window time.Duration) *Corpus {
	t.Helper()
	sc := trace.DefaultSynth()
	sc.Requests, sc.Rate = 120, 40
	reqs, err := trace.Synthesize(sc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Build(reqs, BuildConfig{Workers: 6, BlockSize: 64, TraceBlockSize: 256, Blocks: 512, Dup: dup, LengthFactor: lf}, window)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The corpus: its counters add up, every worker's timeline starts at zero
// and ends at the window (normalised and rescaled), operations are merged
// by deadline with queries first, each worker's events keep their order
// (ids rise), and -dup makes disjoint copies on their own workers.
func TestCorpusConstruction(t *testing.T) {
	const window = time.Second
	c := smallCorpus(t, 1, 1, window)
	d := smallCorpus(t, 3, 1, window)
	l := smallCorpus(t, 1, 2, window)
	ct, dt, lt := c.Totals(), d.Totals(), l.Totals()
	if ct.Requests != 120 || dt.Requests != 360 || d.LogicalWorkers != 18 || len(d.Ops) != 3*len(c.Ops) || dt.BlockOps() != 3*ct.BlockOps() {
		t.Fatalf("dup 3: %d requests on %d workers, %d ops, %d block ops; dup 1: %d ops, %d block ops", dt.Requests, d.LogicalWorkers, len(d.Ops), dt.BlockOps(), len(c.Ops), ct.BlockOps())
	}
	if lt.BlockOps() <= ct.BlockOps()*3/2 {
		t.Fatalf("length factor 2: %d block ops, want about twice %d", lt.BlockOps(), ct.BlockOps())
	}
	if err := d.Check(); err != nil {
		t.Fatal(err)
	}
	var blocks uint64
	stored, removed := uint64(0), uint64(0)
	first, last := map[kvevent.WorkerID]time.Duration{}, map[kvevent.WorkerID]time.Duration{}
	lastID := map[kvevent.WorkerID]uint64{}
	for i, op := range d.Ops {
		if i > 0 {
			p := d.Ops[i-1]
			if op.Deadline < p.Deadline || (op.Deadline == p.Deadline && p.class() > op.class()) {
				t.Fatalf("op %d out of merge order", i)
			}
		}
		if _, ok := first[op.Worker]; !ok {
			first[op.Worker] = op.Deadline
		}
		last[op.Worker] = op.Deadline
		if op.IsQuery() {
			blocks += uint64(len(op.Query))
			continue
		}
		if op.Event.ID != uint64(i)+1 || op.Event.ID <= lastID[op.Worker] {
			t.Fatalf("worker %d: event id %d at %d, after %d", op.Worker, op.Event.ID, i, lastID[op.Worker])
		}
		lastID[op.Worker] = op.Event.ID
		switch e := op.Event.Data.(type) {
		case kvevent.Stored:
			stored++
			blocks += uint64(len(e.Blocks))
		case kvevent.Removed:
			removed++
			blocks += uint64(len(e.BlockHashes))
		}
	}
	if blocks != dt.BlockOps() || stored != dt.StoredEvents || removed != dt.RemovedEvents {
		t.Fatalf("counters: %d block ops counted %d; stored %d/%d removed %d/%d", blocks, dt.BlockOps(), stored, dt.StoredEvents, removed, dt.RemovedEvents)
	}
	for w := range first {
		if first[w] != 0 || (last[w] != window && last[w] != 0) {
			t.Fatalf("worker %d spans [%v, %v], want [0, %v]", w, first[w], last[w], window)
		}
	}
	// Copies are disjoint: no request hash of copy 0 appears in copy 1.
	seen := map[uint64]bool{}
	for _, op := range d.Ops {
		if op.IsQuery() && int(op.Worker) < 6 {
			for _, h := range op.Query {
				seen[h] = true
			}
		}
	}
	for _, op := range d.Ops {
		if op.IsQuery() && int(op.Worker) >= 6 && int(op.Worker) < 12 && seen[op.Query[0]] {
			t.Fatal("copies share hashes")
		}
	}
	if r := c.Rescaled(window / 4); r.Ops[len(r.Ops)-1].Deadline != c.Ops[len(c.Ops)-1].Deadline/4 || &r.Ops[0] == &c.Ops[0] || r.ReferenceWindow != window/4 {
		t.Fatal("rescaling")
	}
	for _, bad := range []BuildConfig{{Workers: 0, Dup: 1, LengthFactor: 1, TraceBlockSize: 512}, {Workers: 1, Dup: 0, LengthFactor: 1, TraceBlockSize: 512},
		{Workers: 1, Dup: 1, LengthFactor: 0, TraceBlockSize: 512}, {Workers: 1, Dup: 1, LengthFactor: 1, TraceBlockSize: 0},
		{Workers: 1, Dup: MaxDup + 1, LengthFactor: 1, TraceBlockSize: 512}, {Workers: MaxLogicalWorkers/4 + 1, Dup: 4, LengthFactor: 1, TraceBlockSize: 512}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// slowIndexer answers every lookup late.
type slowIndexer struct {
	shardpool.Indexer
	delay time.Duration
}

func (s slowIndexer) FindMatches(local []uint64) (radix.OverlapScores, error) {
	time.Sleep(s.delay)
	return s.Indexer.FindMatches(local)
}

// Validity as the reference defines it: an indexer that answers in time
// keeps up with a generous window; one that takes 5 ms a lookup, against a
// window that offers them every few µs, does not (the drain is timed).
func TestValidity(t *testing.T) {
	p := Protocol{Issuers: 2, QueryLanes: 2}
	im := shardpool.Impl{Name: "single", Lanes: 1}
	stop := make(chan struct{})
	c := smallCorpus(t, 1, 1, 2*time.Second)
	// The run's page faults are read on Linux: return the heap's free
	// pages first, or a run in a process warm from the tests before (or
	// -count) may fault in none.
	debug.FreeOSMemory()
	ok := RunFresh(c, im, p, stop)
	if !ok.KeptUp || !ok.GeneratorValid || ok.Interrupted || !ok.Passes() || ok.AchievedBlockOpsPerSec <= 0 || ok.TotalBlockOps != c.Totals().BlockOps() ||
		ok.TotalLogicalOps != uint64(len(c.Ops)) || len(ok.FailureReasons) != 0 || ok.RejectedEvents != 0 || ok.Pairs <= 0 {
		t.Fatalf("generous window: %+v", ok)
	}
	if ok.UpdateAcceptedToFinished.P50 <= 0 || ok.QueryService.P50 <= 0 || ok.QueryService.Max < ok.QueryService.P999 || ok.ElapsedNs < int64(2*time.Second) {
		t.Fatalf("latencies: %+v", ok)
	}
	if ok.IndexBuildNs <= 0 || runtime.GOOS == "linux" && (ok.LaneCPUNs <= 0 || ok.ProcessSysCPUNs < 0 || ok.ProcessSysCPUNs > ok.LaneCPUNs+ok.IssuerCPUNs || ok.PageFaults <= 0) {
		t.Fatalf("usage: build %d ns, lane CPU %d ns, system %d ns, faults %d", ok.IndexBuildNs, ok.LaneCPUNs, ok.ProcessSysCPUNs, ok.PageFaults)
	}
	slow := Run(smallCorpus(t, 1, 1, 20*time.Millisecond), slowIndexer{im.New(64), 5 * time.Millisecond}, im, p, stop)
	if slow.KeptUp || slow.Passes() || slow.ElapsedNs < int64(100*time.Millisecond) || slow.DrainNs < int64(50*time.Millisecond) ||
		!slices.Contains(slow.FailureReasons, "not_kept_up") {
		t.Fatalf("a slow index kept up: %+v", slow)
	}
}

// A run stops issuing at once on the interrupt: what was issued is
// reported, marked interrupted, and neither kept up nor valid.
func TestProtocolInterrupt(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	r := RunFresh(smallCorpus(t, 1, 1, time.Hour), shardpool.Impl{Name: "single", Lanes: 1}, Protocol{Issuers: 2, QueryLanes: 1}, stop)
	if !r.Interrupted || r.KeptUp || r.GeneratorValid {
		t.Fatalf("%+v", r)
	}
}

// A stretch of the harness's work charges the harness for the two
// readings of the clock that measure it: empty stretches one after
// another cost their thread what they charge (without the charge for the
// readings, about half of it). The loop is measured on its own thread,
// so that the collector and other threads of a busy test process do not
// count. A virtual machine's hiccup can still land in the clock's
// measure or the loop's: of three tries, one must be within a quarter.
func TestStretchesChargeTheirClock(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the thread's CPU clock is read on Linux only")
	}
	var tries []string
	for range 3 {
		charged, used := emptyStretches(50_000)
		r := float64(charged) / float64(used)
		if r >= 0.75 && r <= 1.25 {
			return
		}
		tries = append(tries, fmt.Sprintf("%v of %v (%.2f)", time.Duration(charged), time.Duration(used), r))
	}
	t.Errorf("50,000 empty stretches charged the harness, of the CPU they took: %s; want 0.75-1.25 once", strings.Join(tries, ", "))
}

// emptyStretches runs n empty stretches of the harness's work on a
// thread of their own, and returns the CPU they charged and took.
func emptyStretches(n int) (charged, used int64) {
	s := &runState{clockRead: clockRead()} // as Run measures it, as it starts
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	for range n {
		s.rest(s.work())
	}
	return s.harnessCPU.Load(), threadCPU() - t0
}
