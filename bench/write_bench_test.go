package bench

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// concurrentIndexImpls are the indexes whose writers may run in parallel.
var concurrentIndexImpls = []struct {
	name string
	new  func() radix.ConcurrentIndex
}{
	{"concurrent", func() radix.ConcurrentIndex { return radix.NewConcurrentTree() }},
	{"compressed", func() radix.ConcurrentIndex { return radix.NewCompressedTree() }},
}

// BenchmarkParallelStore is write scaling on the trace-shaped workload:
// each iteration stores the whole embedded trace (16 workers, ~767 blocks a
// request) into an empty index with GOMAXPROCS writers, writer g storing
// the requests of the workers w with w mod writers = g, in trace order, as
// pool lanes would. Every writer count does the same work, so ns/op
// compares directly: run with -cpu 1,2,... (writers = the -cpu value, at
// most 16). ns/block is per stored block of the whole trace.
func BenchmarkParallelStore(b *testing.B) {
	reqs, blocks := shapedWorkload(b)
	writers := min(runtime.GOMAXPROCS(0), shapedWorkers)
	for _, im := range concurrentIndexImpls {
		b.Run("impl="+im.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				idx := im.new()
				runtime.GC()
				b.StartTimer()
				var wg sync.WaitGroup
				for g := range writers {
					wg.Go(func() {
						for i := range reqs {
							if int(reqs[i].store.WorkerID)%writers != g {
								continue
							}
							if err := idx.Apply(reqs[i].store); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blocks), "ns/block")
			b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkTail is vLLM's eviction order against its storing order on one
// run: op=store extends a worker's chain by one block per event up to
// run=L blocks; op=remove removes such a chain one block per event from
// its tail, so that each removal trims the run. A second worker holds the
// chain's first block, so the run outlives the removals. ns/block is per
// stored or removed block; flat in L is the goal.
func BenchmarkTail(b *testing.B) {
	for _, op := range []string{"store", "remove"} {
		for _, im := range indexImpls {
			for _, run := range []int{256, 1024, 16384} {
				b.Run(fmt.Sprintf("op=%s/impl=%s/run=%d", op, im.name, run), func(b *testing.B) {
					tail(b, im.new, op == "remove", run)
				})
			}
		}
	}
}

func tail(b *testing.B, newIndex func() radix.Index, remove bool, run int) {
	w, other := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	stores := make([]kvevent.RouterEvent, run)
	removes := make([]kvevent.RouterEvent, run)
	for i := range stores {
		stores[i] = chain(w, uint64(i-1), i > 0, uint64(i), 1, func(int) uint64 { return tokensHash(i) })
	}
	for i := range removes {
		removes[i] = removal(stores[run-1-i])
	}
	apply := func(idx radix.Index, ev kvevent.RouterEvent) {
		if err := idx.Apply(ev); err != nil {
			b.Fatal(err)
		}
	}
	fresh := func() radix.Index {
		idx := newIndex()
		apply(idx, chain(other, 0, false, 1<<40, 1, tokensHash))
		if remove {
			for _, ev := range stores {
				apply(idx, ev)
			}
		}
		return idx
	}
	idx, i := fresh(), 0
	b.ReportAllocs()
	for b.Loop() {
		if i == run {
			b.StopTimer()
			idx, i = fresh(), 0
			b.StartTimer()
		}
		if remove {
			apply(idx, removes[i])
		} else {
			apply(idx, stores[i])
		}
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/block")
}
