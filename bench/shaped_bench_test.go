package bench

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/internal/pages"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/trace"
)

// shapedWorkers is how many workers the trace-shaped workload spreads the
// trace's requests over.
const shapedWorkers = 16

// shapedReq is one request of the trace-shaped workload: the Stored event
// of its whole prompt (every complete 16-token block, engine hashes chained
// as Dynamo's) on worker i mod 16, and its local hashes to match.
type shapedReq struct {
	store kvevent.RouterEvent
	local []uint64
}

var (
	shapedOnce sync.Once
	shapedReqs []shapedReq
	shapedErr  error
	shapedBlks int
)

// shapedWorkload is every request of the embedded Mooncake conversation
// trace stored whole on 16 workers: each 512-token hash id is 32 blocks of
// 16 tokens, ~767 blocks a request, ~8.3M worker-block pairs in all.
func shapedWorkload(b testing.TB) ([]shapedReq, int) {
	shapedOnce.Do(func() {
		reqs, err := trace.ReadAll(trace.Default())
		if err != nil {
			shapedErr = err
			return
		}
		var toks []uint32
		for i, r := range reqs {
			toks = trace.Tokens(toks[:0], r)
			local := hashing.LocalHashes(nil, toks, 16, hashing.Options{})
			seq := hashing.SequenceHashes(nil, local)
			st := kvevent.Stored{Blocks: make([]kvevent.StoredBlock, len(local))}
			for j := range local {
				st.Blocks[j] = kvevent.StoredBlock{BlockHash: seq[j], TokensHash: local[j]}
			}
			shapedReqs = append(shapedReqs, shapedReq{
				store: kvevent.RouterEvent{WorkerID: kvevent.WorkerID(i % shapedWorkers), Event: kvevent.Event{ID: uint64(i), Data: st}},
				local: local,
			})
			shapedBlks += len(local)
		}
	})
	if shapedErr != nil {
		b.Fatal(shapedErr)
	}
	return shapedReqs, shapedBlks
}

// buildShaped stores every request of the workload and returns the index
// with the bytes of heap it took per (worker, block) pair.
func buildShaped(b *testing.B, newIndex func() radix.Index, reqs []shapedReq) (radix.Index, float64) {
	before := liveHeap(b)
	idx := newIndex()
	for i := range reqs {
		if err := idx.Apply(reqs[i].store); err != nil {
			b.Fatal(err)
		}
	}
	return idx, float64(liveHeap(b)-before) / float64(idx.Size())
}

// liveHeap is the heap's live bytes, once a grown tree's warm ahead, which
// holds heap it drops when it ends, has ended. The collector runs twice
// before the reading, so that nothing left in a sync.Pool's victim cache
// counts.
func liveHeap(b *testing.B) int64 {
	testwait.For(b, "the warm ahead to end", func() bool { return !pages.Warming() })
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// shapedStride is a prime step through the requests: lookups sample the
// whole trace in any number of iterations.
const shapedStride = 7919

// BenchmarkShaped is the trace-shaped workload. op=lookup matches each
// request in turn against the whole index (ns/op is per request; B/pair is
// the index's heap per worker-block pair); op=store stores the requests in
// turn into an index that starts empty (ns/op per request, ns/block per
// stored block). Run it with -benchtime 12031x to store the whole trace
// once and sample every request once.
func BenchmarkShaped(b *testing.B) {
	reqs, blocks := shapedWorkload(b)
	perReq := float64(blocks) / float64(len(reqs))
	for _, im := range indexImpls {
		b.Run(fmt.Sprintf("op=lookup/impl=%s", im.name), func(b *testing.B) {
			idx, perPair := buildShaped(b, im.new, reqs)
			b.ReportAllocs()
			i, done := 0, 0
			for b.Loop() {
				done += len(idx.FindMatches(reqs[i].local, false).Scores)
				i = (i + shapedStride) % len(reqs) // across the whole trace, whatever b.N
			}
			if done == 0 {
				b.Fatal("no request matched")
			}
			b.ReportMetric(perPair, "B/pair")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/perReq, "ns/block")
			runtime.KeepAlive(idx)
		})
		b.Run(fmt.Sprintf("op=store/impl=%s", im.name), func(b *testing.B) {
			idx := im.new()
			b.ReportAllocs()
			i, stored := 0, 0
			for b.Loop() {
				if err := idx.Apply(reqs[i].store); err != nil {
					b.Fatal(err)
				}
				stored += len(reqs[i].local)
				if i = (i + 1) % len(reqs); i == 0 {
					b.StopTimer()
					idx = im.new()
					runtime.GC()
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(stored), "ns/block")
		})
	}
}

// BenchmarkSharedPrefix matches one 64-block sequence when 16 workers each
// hold 256 sequences of 64 blocks that share their first 16 blocks.
func BenchmarkSharedPrefix(b *testing.B) {
	const workers, seqs, depth, shared = 16, 256, 64, 16
	tok := func(s int) func(int) uint64 {
		return func(i int) uint64 {
			if i < shared {
				return tokensHash(i)
			}
			return tokensHash(s*depth + i)
		}
	}
	q := make([]uint64, depth)
	for i := range q {
		q[i] = tok(seqs / 2)(i)
	}
	for _, im := range indexImpls {
		idx := im.new()
		for w := range workers {
			for s := range seqs {
				ev := chain(kvevent.Worker{ID: kvevent.WorkerID(w)}, 0, false, uint64(s)<<32, depth, tok(s))
				if err := idx.Apply(ev); err != nil {
					b.Fatal(err)
				}
			}
		}
		if got := idx.FindMatches(q, false).Scores; len(got) != workers {
			b.Fatalf("scores %v", got)
		}
		b.Run("impl="+im.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				idx.FindMatches(q, false)
			}
			b.ReportMetric(depth*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
		if ap, ok := idx.(appender); ok {
			b.Run("impl="+im.name+"/api=append", func(b *testing.B) {
				var buf []radix.Match
				b.ReportAllocs()
				for b.Loop() {
					buf = ap.AppendMatches(buf[:0], q, false)
				}
				b.ReportMetric(depth*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
			})
		}
	}
}

// appender is an index with an allocation-free match API.
type appender interface {
	AppendMatches(dst []radix.Match, local []uint64, earlyExit bool) []radix.Match
}

// BenchmarkTiers is the trace-shaped workload with a second tier: every
// request stored on the device (B/pair: the index's heap per device pair),
// then again on the host (B/host-pair: what each host pair adds); ns/op is
// one FindTierMatches of a request against the whole index.
func BenchmarkTiers(b *testing.B) {
	reqs, _ := shapedWorkload(b)
	for _, im := range []struct {
		name string
		new  func() radix.TierIndex
	}{
		{"concurrent", func() radix.TierIndex { return radix.NewConcurrentTree() }},
		{"compressed", func() radix.TierIndex { return radix.NewCompressedTree() }},
	} {
		b.Run("impl="+im.name, func(b *testing.B) {
			idx, perPair := buildShaped(b, func() radix.Index { return im.new() }, reqs)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			device := idx.Size()
			for i := range reqs {
				ev := reqs[i].store
				ev.Tier = kvevent.TierHostPinned
				if err := idx.Apply(ev); err != nil {
					b.Fatal(err)
				}
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			perHost := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(idx.Size()-device)
			ti := idx.(radix.TierIndex)
			i := 0
			for b.Loop() {
				ti.FindTierMatches(reqs[i].local)
				i = (i + shapedStride) % len(reqs)
			}
			b.ReportMetric(perPair, "B/pair")
			b.ReportMetric(perHost, "B/host-pair")
			runtime.KeepAlive(idx)
		})
	}
}
