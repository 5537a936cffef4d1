package bench

import (
	"sync"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/replay"
	"github.com/kvradix/kvradix/trace"
)

// workload is a trace-derived timeline (replay.Workload), built once per
// test binary on first use.
type workload struct {
	requests        int // the trace's first requests (0: all)
	workers, blocks int
	once            sync.Once
	ops             []replay.Op
	err             error
}

// get returns the workload, building it the first time.
func (w *workload) get(b *testing.B) []replay.Op {
	w.once.Do(func() {
		reqs, err := trace.ReadAll(trace.Default())
		if err != nil {
			w.err = err
			return
		}
		if w.requests > 0 {
			reqs = reqs[:w.requests]
		}
		cfg := replay.DefaultConfig()
		cfg.Workers, cfg.Blocks = w.workers, w.blocks
		w.ops, w.err = replay.Workload(reqs, cfg)
	})
	if w.err != nil {
		b.Fatal(w.err)
	}
	return w.ops
}

// traceWorkload is the first 2,000 requests of the embedded Mooncake trace
// spread over 100 simulated workers: their engines' KV events and the
// requests' matches, in time order.
var traceWorkload = &workload{requests: 2000, workers: 100, blocks: 4096}

// BenchmarkTrace applies the trace-derived workload, events and matches in
// order, to a fresh index per iteration. blocks/s counts the blocks of
// events and matches.
func BenchmarkTrace(b *testing.B) {
	ops := traceWorkload.get(b)
	blocks := 0
	for i := range ops {
		blocks += ops[i].Blocks()
	}
	for _, im := range indexImpls {
		b.Run("impl="+im.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				idx := im.new()
				for i := range ops {
					op := &ops[i]
					if op.Match != nil {
						idx.FindMatches(op.Match, false)
						continue
					}
					_ = idx.Apply(kvevent.RouterEvent{WorkerID: op.Worker, Event: op.Event})
				}
			}
			b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
