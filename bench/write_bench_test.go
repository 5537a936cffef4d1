package bench

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// concurrentIndexImpls are the indexes whose writers may run in parallel;
// new makes one for about blocks distinct blocks (a sized table's hint).
var concurrentIndexImpls = []struct {
	name string
	new  func(blocks int) radix.ConcurrentIndex
}{
	{"concurrent", func(int) radix.ConcurrentIndex { return radix.NewConcurrentTree() }},
	{"compressed", func(int) radix.ConcurrentIndex { return radix.NewCompressedTree() }},
	{"compressed-sized", func(blocks int) radix.ConcurrentIndex { return radix.NewCompressedTreeSized(blocks) }},
}

// BenchmarkParallelStore is write scaling on the trace-shaped workload:
// each iteration stores the whole embedded trace (16 workers, ~767 blocks a
// request) into an empty index with GOMAXPROCS writers, writer g storing
// the requests of the workers w with w mod writers = g, in trace order, as
// pool lanes would. Every writer count does the same work, so ns/op
// compares directly: run with -cpu 1,2,... (writers = the -cpu value, at
// most 16, reported as writers). ns/block is per stored block of the whole
// trace. The sized tree's table is sized for the trace's stored blocks
// (more than its distinct blocks), outside the timer.
//
// It loops over b.N, not b.Loop: the testing package makes a benchmark's
// first call at the -cpu list's last value (golang/go#49980), and a b.Loop
// benchmark's first call is its whole measurement, so with b.Loop the
// first -cpu figure of a list ran at its last (the writers, read then,
// were as wrong). A b.N benchmark is called again at each -cpu value.
// A -benchtime shorter than one iteration keeps that first call's figure,
// the process's first store, into a cold heap: -benchtime 2x or more
// measures warm ones.
func BenchmarkParallelStore(b *testing.B) {
	reqs, blocks := shapedWorkload(b)
	for _, im := range concurrentIndexImpls {
		b.Run("impl="+im.name, func(b *testing.B) {
			writers := min(runtime.GOMAXPROCS(0), shapedWorkers)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				idx := im.new(blocks)
				runtime.GC()
				b.StartTimer()
				storeParallel(b, idx, reqs, writers)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blocks), "ns/block")
			b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
			b.ReportMetric(float64(writers), "writers")
		})
	}
}

// storeParallel stores reqs into idx with the given writers, writer g
// storing the requests of the workers w with w mod writers = g, in order.
func storeParallel(b *testing.B, idx radix.ConcurrentIndex, reqs []shapedReq, writers int) {
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

// BenchmarkEvictBatch is eviction as engines batch it under load: the
// whole trace stored (16 workers), then every block each worker holds
// removed in events of batch=N hashes, in a shuffled order (an LRU evicts
// far from storing order), so that each hash's lookup is a cache miss;
// lane=0 applies the events one by one, lane=64 64 at a time through
// ApplyBatch, as a pool lane does. ns/block is per removed block.
// order=tail removes them a hash an event as vLLM evicts a finished
// sequence, from its tail: each worker's requests last first, each from
// its last block (a block another request of the worker shares goes with
// the first to name it).
func BenchmarkEvictBatch(b *testing.B) {
	reqs, _ := shapedWorkload(b)
	held := map[kvevent.WorkerID]map[uint64]bool{}
	for _, r := range reqs {
		w := r.store.WorkerID
		if held[w] == nil {
			held[w] = map[uint64]bool{}
		}
		for _, blk := range r.store.Event.Data.(kvevent.Stored).Blocks {
			held[w][blk.BlockHash] = true
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, batch := range []int{1, 64, 512} {
		var removals []kvevent.RouterEvent
		blocks := 0
		for w := range kvevent.WorkerID(shapedWorkers) {
			hs := slices.Collect(maps.Keys(held[w]))
			slices.Sort(hs)
			rng.Shuffle(len(hs), func(i, j int) { hs[i], hs[j] = hs[j], hs[i] })
			blocks += len(hs)
			for len(hs) > 0 {
				n := min(batch, len(hs))
				removals = append(removals, kvevent.RouterEvent{WorkerID: w, Event: kvevent.Event{Data: kvevent.Removed{BlockHashes: hs[:n]}}})
				hs = hs[n:]
			}
		}
		lanes := []int{0}
		if batch == 1 {
			lanes = append(lanes, 64) // a pool lane's batches of events, as vLLM sends a hash an event
		}
		for _, lane := range lanes {
			b.Run(fmt.Sprintf("impl=compressed/batch=%d/lane=%d", batch, lane), func(b *testing.B) {
				overTrace(b, reqs, removals, blocks, lane)
			})
		}
	}
	tail := tailFirst(reqs)
	for _, lane := range []int{0, 64} {
		b.Run(fmt.Sprintf("impl=compressed/batch=1/lane=%d/order=tail", lane), func(b *testing.B) {
			overTrace(b, reqs, tail, len(tail), lane)
		})
	}
}

// overTrace times evs applied to an index holding the trace's stores,
// made for each iteration; ns/block is per block of evs (blocks in all).
func overTrace(b *testing.B, reqs []shapedReq, evs []kvevent.RouterEvent, blocks, lane int) {
	for b.Loop() {
		b.StopTimer()
		idx := radix.NewCompressedTree()
		for _, r := range reqs {
			if err := idx.Apply(r.store); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		b.StartTimer()
		applyAll(b, idx, evs, lane)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blocks), "ns/block")
}

// BenchmarkDecode is the stores of engines decoding, as vLLM sends them:
// the whole trace stored (16 workers), then, for seqs=N sequences a
// worker (its last N requests), a block at a time under the block the
// sequence's last store ended with, the sequences of each worker in turn
// (a decode step fills a block of each), 64Ki blocks in all. Every store
// is of one block, where the table's lines, the runs' and the parent's are
// cache misses. lane as in BenchmarkEvictBatch; ns/block is per stored
// block.
func BenchmarkDecode(b *testing.B) {
	reqs, _ := shapedWorkload(b)
	for _, seqs := range []int{1, 32, 256} {
		evs, _ := decodeSteps(reqs, seqs, 1<<16)
		for _, lane := range []int{0, 64} {
			b.Run(fmt.Sprintf("impl=compressed/seqs=%d/lane=%d", seqs, lane), func(b *testing.B) {
				overTrace(b, reqs, evs, len(evs), lane)
			})
		}
	}
}

// BenchmarkDecodeMemory is the heap decoding takes: the whole trace
// stored on 16 workers, then BenchmarkDecode's 64Ki one-block stores, for
// seqs sequences a worker. B/decoded is the heap the stores added, a
// stored block; B/pair the whole index's, a worker-block pair.
func BenchmarkDecodeMemory(b *testing.B) {
	reqs, _ := shapedWorkload(b)
	for _, seqs := range []int{1, 32, 256} {
		evs, _ := decodeSteps(reqs, seqs, 1<<16)
		b.Run(fmt.Sprintf("impl=compressed/seqs=%d", seqs), func(b *testing.B) {
			for b.Loop() {
				start := liveHeap(b)
				idx := radix.NewCompressedTree()
				for _, r := range reqs {
					if err := idx.Apply(r.store); err != nil {
						b.Fatal(err)
					}
				}
				stored := liveHeap(b)
				applyAll(b, idx, evs, 0)
				end := liveHeap(b)
				b.ReportMetric(float64(end-stored)/float64(len(evs)), "B/decoded")
				b.ReportMetric(float64(end-start)/float64(idx.Size()), "B/pair")
			}
		})
	}
}

// BenchmarkDecodeLookup is a lookup (AppendMatches) of a decoding
// sequence's whole path, its request's blocks and the 16 it decoded, after
// the whole trace and those one-block stores, each sequence in turn; ns/op
// is a lookup's.
func BenchmarkDecodeLookup(b *testing.B) {
	reqs, _ := shapedWorkload(b)
	for _, seqs := range []int{32, 256} {
		evs, paths := decodeSteps(reqs, seqs, shapedWorkers*seqs*16)
		b.Run(fmt.Sprintf("impl=compressed/seqs=%d", seqs), func(b *testing.B) {
			idx := radix.NewCompressedTree()
			for _, r := range reqs {
				if err := idx.Apply(r.store); err != nil {
					b.Fatal(err)
				}
			}
			applyAll(b, idx, evs, 0)
			var dst []radix.Match
			for _, p := range paths {
				dst = idx.AppendMatches(dst[:0], p, false)
				if !slices.ContainsFunc(dst, func(m radix.Match) bool { return int(m.Score) == len(p) }) {
					b.Fatalf("no worker holds a decoded path of %d blocks whole", len(p))
				}
			}
			i := 0
			for b.Loop() {
				dst = idx.AppendMatches(dst[:0], paths[i], false)
				i = (i + 1) % len(paths)
			}
		})
	}
}

// decodeSteps returns n one-block stores (new engine and tokens hashes),
// each under the last block of its sequence: the last seqs requests of
// each worker, then the blocks stored after them, each worker's sequences
// in turn; none if no request stores a block. paths are the sequences'
// tokens hashes: the request's, then those of the blocks decoded.
func decodeSteps(reqs []shapedReq, seqs, n int) (evs []kvevent.RouterEvent, paths [][]uint64) {
	type sequence struct {
		w    kvevent.Worker
		tip  uint64
		path []uint64
	}
	var all []*sequence
	count := map[kvevent.WorkerID]int{}
	for i := len(reqs) - 1; i >= 0; i-- {
		w := reqs[i].store.WorkerID
		if bs := reqs[i].store.Event.Data.(kvevent.Stored).Blocks; count[w] < seqs && len(bs) > 0 {
			count[w]++
			all = append(all, &sequence{kvevent.Worker{ID: w}, bs[len(bs)-1].BlockHash, slices.Clone(reqs[i].local)})
		}
	}
	slices.SortStableFunc(all, func(a, b *sequence) int { return cmp.Compare(a.w.ID, b.w.ID) })
	evs = make([]kvevent.RouterEvent, 0, n)
	next := uint64(1) << 62 // above the trace's engine hashes
	for len(evs) < n && len(all) > 0 {
		for _, s := range all[:min(len(all), n-len(evs))] {
			next++
			tok := tokensHash(int(next))
			evs = append(evs, chain(s.w, s.tip, true, next, 1, func(int) uint64 { return tok }))
			s.tip, s.path = next, append(s.path, tok)
		}
	}
	for _, s := range all {
		paths = append(paths, s.path)
	}
	return evs, paths
}

// tailFirst removes every block the trace's stores leave held, a hash an
// event, each worker's requests last first and each from its tail.
func tailFirst(reqs []shapedReq) []kvevent.RouterEvent {
	gone := map[kvevent.WorkerID]map[uint64]bool{}
	var out []kvevent.RouterEvent
	for i := len(reqs) - 1; i >= 0; i-- {
		w := reqs[i].store.WorkerID
		if gone[w] == nil {
			gone[w] = map[uint64]bool{}
		}
		bs := reqs[i].store.Event.Data.(kvevent.Stored).Blocks
		for j := len(bs) - 1; j >= 0; j-- {
			if h := bs[j].BlockHash; !gone[w][h] {
				gone[w][h] = true
				out = append(out, kvevent.RouterEvent{WorkerID: w, Event: kvevent.Event{Data: kvevent.Removed{BlockHashes: []uint64{h}}}})
			}
		}
	}
	return out
}

// applyAll applies the events one by one (lane 0), or lane at a time
// through ApplyBatch, as a pool lane does.
func applyAll(b *testing.B, idx *radix.CompressedTree, evs []kvevent.RouterEvent, lane int) {
	if lane == 0 {
		for _, ev := range evs {
			if err := idx.Apply(ev); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	errs := make([]error, lane)
	for len(evs) > 0 {
		n := min(lane, len(evs))
		idx.ApplyBatch(evs[:n], errs)
		for _, err := range errs[:n] {
			if err != nil {
				b.Fatal(err)
			}
		}
		evs = evs[n:]
	}
}
