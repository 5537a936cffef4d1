package bench

import (
	"sync"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/replay"
	"github.com/kvradix/kvradix/trace"
)

var (
	traceOnce sync.Once
	traceOps  []replay.Op
	traceErr  error
)

// traceWorkload is the first 2,000 requests of the embedded Mooncake trace
// spread over 100 simulated workers: their engines' KV events and the
// requests' matches, in time order.
func traceWorkload(b *testing.B) []replay.Op {
	traceOnce.Do(func() {
		reqs, err := trace.ReadAll(trace.Default())
		if err != nil {
			traceErr = err
			return
		}
		cfg := replay.DefaultConfig()
		cfg.Workers, cfg.Blocks = 100, 4096
		traceOps, traceErr = replay.Workload(reqs[:2000], cfg)
	})
	if traceErr != nil {
		b.Fatal(traceErr)
	}
	return traceOps
}

// BenchmarkTrace applies the trace-derived workload, events and matches in
// order, to a fresh index per iteration. blocks/s counts the blocks of
// events and matches.
func BenchmarkTrace(b *testing.B) {
	ops := traceWorkload(b)
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
