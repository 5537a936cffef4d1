package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/shardpool"
	"github.com/kvradix/kvradix/trace"
)

func smallCorpus(t *testing.T, dup, lf int, window time.Duration) *corpus {
	t.Helper()
	sc := trace.DefaultSynth()
	sc.Requests, sc.Rate = 120, 40
	reqs, err := trace.Synthesize(sc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := buildCorpus(reqs, corpusConfig{Workers: 6, BlockSize: 64, TraceBlockSize: 256, Blocks: 512, Dup: dup, LengthFactor: lf}, window)
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
	if c.requests != 120 || d.requests != 360 || d.workers != 18 || len(d.ops) != 3*len(c.ops) || d.blockOps != 3*c.blockOps {
		t.Fatalf("dup 3: %d requests on %d workers, %d ops, %d block ops; dup 1: %d ops, %d block ops", d.requests, d.workers, len(d.ops), d.blockOps, len(c.ops), c.blockOps)
	}
	if l.blockOps <= c.blockOps*3/2 {
		t.Fatalf("length factor 2: %d block ops, want about twice %d", l.blockOps, c.blockOps)
	}
	var blocks int64
	stored, removed := 0, 0
	first, last := map[kvevent.WorkerID]time.Duration{}, map[kvevent.WorkerID]time.Duration{}
	lastID := map[kvevent.WorkerID]uint64{}
	for i, op := range d.ops {
		if i > 0 {
			p := d.ops[i-1]
			if op.at < p.at || (op.at == p.at && p.class() > op.class()) {
				t.Fatalf("op %d out of merge order", i)
			}
		}
		if _, ok := first[op.worker]; !ok {
			first[op.worker] = op.at
		}
		last[op.worker] = op.at
		if op.isQuery() {
			blocks += int64(len(op.query))
			continue
		}
		if op.ev.ID <= lastID[op.worker] {
			t.Fatalf("worker %d: event id %d after %d", op.worker, op.ev.ID, lastID[op.worker])
		}
		lastID[op.worker] = op.ev.ID
		switch e := op.ev.Data.(type) {
		case kvevent.Stored:
			stored++
			blocks += int64(len(e.Blocks))
		case kvevent.Removed:
			removed++
			blocks += int64(len(e.BlockHashes))
		}
	}
	if blocks != d.blockOps || stored != d.stored || removed != d.removed || d.logicalOps() != d.requests+d.stored+d.removed+d.cleared {
		t.Fatalf("counters: %d block ops counted %d; stored %d/%d removed %d/%d", blocks, d.blockOps, stored, d.stored, removed, d.removed)
	}
	for w := range first {
		if first[w] != 0 || (last[w] != window && last[w] != 0) {
			t.Fatalf("worker %d spans [%v, %v], want [0, %v]", w, first[w], last[w], window)
		}
	}
	// Copies are disjoint: no request hash of copy 0 appears in copy 1.
	seen := map[uint64]bool{}
	for _, op := range d.ops {
		if op.isQuery() && int(op.worker) < 6 {
			for _, h := range op.query {
				seen[h] = true
			}
		}
	}
	for _, op := range d.ops {
		if op.isQuery() && int(op.worker) >= 6 && int(op.worker) < 12 && seen[op.query[0]] {
			t.Fatal("copies share hashes")
		}
	}
	if r := c.rescaled(window / 4); r.ops[len(r.ops)-1].at != c.ops[len(c.ops)-1].at/4 || &r.ops[0] == &c.ops[0] {
		t.Fatal("rescaling")
	}
	for _, bad := range []corpusConfig{{Workers: 0, Dup: 1, LengthFactor: 1, TraceBlockSize: 512}, {Workers: 1, Dup: 0, LengthFactor: 1, TraceBlockSize: 512},
		{Workers: 1, Dup: 1, LengthFactor: 0, TraceBlockSize: 512}, {Workers: 1, Dup: 1, LengthFactor: 1, TraceBlockSize: 0}} {
		if bad.validate() == nil {
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
	p := protocol{Issuers: 2, QueryLanes: 2}
	im := shardpool.Impl{Name: "single", Lanes: 1}
	stop := make(chan struct{})
	ok := smallCorpus(t, 1, 1, 2*time.Second).run(im, 64, p, stop)
	if !ok.KeptUp || !ok.GeneratorValid || ok.Interrupted || ok.AchievedBlockOpS <= 0 || ok.BlockOps <= 0 || ok.LogicalOps != ok.Ops {
		t.Fatalf("generous window: %+v", ok)
	}
	if ok.UpdateLatencyUs.P50 <= 0 || ok.QueryServiceUs != ok.FindMatchesUs || ok.IssueLagUs.P999 <= 0 {
		t.Fatalf("latencies: %+v", ok)
	}
	slow := smallCorpus(t, 1, 1, 20*time.Millisecond).runOn(slowIndexer{im.New(64), 5 * time.Millisecond}, im, p, stop)
	if slow.KeptUp || !slow.Saturated || slow.ElapsedS < 0.1 || slow.DrainMs < 50 {
		t.Fatalf("a slow index kept up: %+v", slow)
	}
}

// A run stops issuing at once on the interrupt: what was issued is
// reported, marked interrupted, and neither kept up nor valid.
func TestProtocolInterrupt(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	r := smallCorpus(t, 1, 1, time.Hour).run(shardpool.Impl{Name: "single", Lanes: 1}, 64, protocol{Issuers: 2, QueryLanes: 1}, stop)
	if !r.Interrupted || r.KeptUp || r.GeneratorValid {
		t.Fatalf("%+v", r)
	}
}

// -repeat runs fresh processes and reports each indexer's median and
// spread.
func TestIndexerRepeat(t *testing.T) {
	out, _, err := runArgs(t, append([]string{"indexer", "-json", "-repeat", "2", "-compare", "compressed", "-duration", "200ms"}, indexerSmall...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rep repeatReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep.Repeat != 2 || len(rep.Runs) != 2 || len(rep.Summary) != 1 || rep.Summary[0].Runs != 2 || rep.Summary[0].Impl != "compressed" {
		t.Fatalf("%+v", rep)
	}
	s := rep.Summary[0].AchievedBlockOpS
	if !(s.Min <= s.Median && s.Median <= s.Max && s.Min > 0) || !strings.Contains(rep.Command, "-repeat 2") {
		t.Fatalf("%+v", rep)
	}
	if _, _, err := runArgs(t, "indexer", "-repeat", "0"); err == nil {
		t.Fatal("-repeat 0 accepted")
	}
}

// -sustained searches the threshold in fresh processes: every point
// reported, the window halving until one fails and then bisected, the
// sustained rate a passing point's offered rate, with its figure per
// second of the index's CPU.
func TestSustained(t *testing.T) {
	out, _, err := runArgs(t, append([]string{"indexer", "-json", "-sustained", "-compare", "compressed", "-duration", "400ms"}, indexerSmall...)...)
	if err != nil {
		t.Fatal(err)
	}
	var rep sustainedReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Points) < 2 {
		t.Fatalf("%d points", len(rep.Points))
	}
	best := 0.0
	for _, p := range rep.Points {
		if p.Passed {
			if len(p.AchievedBlockOpsS) != sustainedRuns {
				t.Fatalf("a passing point of %d processes", len(p.AchievedBlockOpsS))
			}
			best = max(best, p.OfferedBlockOpsS)
		}
	}
	if rep.SustainedBlockOpsS != best || (best > 0 && rep.SustainedPerLaneCPU <= 0) {
		t.Fatalf("sustained %v (per lane CPU %v), best passing point %v", rep.SustainedBlockOpsS, rep.SustainedPerLaneCPU, best)
	}
}
