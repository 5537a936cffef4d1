package bench

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/shardpool"
)

// indexerImpls is every indexer, the pools at 1, 2 and 4 lanes.
var indexerImpls = func() []shardpool.Impl {
	impls, err := shardpool.ParseImpls(strings.Join(shardpool.ImplNames, ","), []int{1, 2, 4})
	if err != nil {
		panic(err)
	}
	return impls
}()

// BenchmarkMixed runs readers and event appliers together, as a router
// does: 64 workers hold a shared 512-block prefix; each parallel goroutine
// either matches the 512-block prefix (reads=R percent of its ops) or, as
// its own worker, stores 16 blocks under the prefix and later removes them.
// The final Flush is timed, so queued events count. Run with -cpu 1,2,...
func BenchmarkMixed(b *testing.B) {
	const depth, workers, eventBlocks = 512, 64, 16
	for _, reads := range []int{50, 90, 99} {
		for _, im := range indexerImpls {
			b.Run(fmt.Sprintf("%v/reads=%d", im, reads), func(b *testing.B) {
				idx := im.New(16)
				defer idx.Close()
				for i := range workers {
					if err := idx.ApplyEvent(chain(kvevent.Worker{ID: kvevent.WorkerID(i)}, 0, false, 0, depth, tokensHash)); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := idx.Flush(); err != nil {
					b.Fatal(err)
				}
				q := make([]uint64, depth)
				for i := range q {
					q[i] = tokensHash(i)
				}
				var gid atomic.Uint64
				var blocks atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					w := kvevent.Worker{ID: kvevent.WorkerID(1000 + gid.Add(1))}
					// The goroutine's own chain to hang its events under.
					if err := idx.ApplyEvent(chain(w, 0, false, 0, 4, tokensHash)); err != nil {
						b.Error(err) // Fatal may not be called from RunParallel's goroutines
						return
					}
					var n, done int64
					stored := false
					var store, remove kvevent.RouterEvent
					for i := 0; pb.Next(); i++ {
						if i%100 < reads {
							if _, err := idx.FindMatches(q); err != nil {
								b.Error(err)
								return
							}
							done += depth
							continue
						}
						if !stored {
							n++
							store = chain(w, 3, true, uint64(n)<<20, eventBlocks, func(i int) uint64 { return tokensHash(int(n)*eventBlocks + i + depth) })
							remove = removal(store)
							_ = idx.ApplyEvent(store)
						} else {
							_ = idx.ApplyEvent(remove)
						}
						stored = !stored
						done += eventBlocks
					}
					blocks.Add(done)
				})
				if _, err := idx.Flush(); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if st := idx.Stats(); st.Rejected() != 0 {
					b.Fatalf("rejected events: %+v", st)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
				b.ReportMetric(float64(blocks.Load())/b.Elapsed().Seconds(), "blocks/s")
			})
		}
	}
}

// BenchmarkFindMatchesParallel is read-only scaling: every goroutine
// matches a 128-block prefix held by 64 workers, staggered. api=append
// matches without building result maps (no allocation).
func BenchmarkFindMatchesParallel(b *testing.B) {
	for _, im := range indexImpls {
		idx := im.new()
		q := findSetup(b, idx, "partial", 128, 64)
		b.Run("impl="+im.name, func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					idx.FindMatches(q, false)
				}
			})
			b.ReportMetric(128*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
		if ap, ok := idx.(appender); ok {
			b.Run("impl="+im.name+"/api=append", func(b *testing.B) {
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					var buf []radix.Match
					for pb.Next() {
						buf = ap.AppendMatches(buf[:0], q, false)
					}
				})
				b.ReportMetric(128*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
			})
		}
	}
}

// BenchmarkApplyParallel is write scaling on the concurrent indexes: every
// goroutine is its own worker (as a pool lane would be) storing 16 blocks
// of its own (its own tokens and engine hashes) under a shared prefix of
// 64 or 1,024 blocks and removing them again; compare at a fixed
// -benchtime Nx (the table's tombstones: results/tombstone-purge.txt). Its
// tails:
//
//   - same: the same blocks every iteration, as an engine evicts and
//     recomputes them. One goroutine's can go on in the prefix's own run
//     (the compressed tree's, at its end), the others' in runs of their
//     own beside them.
//   - alternate: two tails in turn, as a document asked one question after
//     another, each evicted before the next.
//   - sibling: the same blocks, but another worker's block already goes on
//     past the prefix, so that every goroutine's blocks make a run of
//     their own and delete it, at every -cpu alike.
func BenchmarkApplyParallel(b *testing.B) {
	for _, im := range indexImpls {
		if _, ok := im.new().(radix.ConcurrentIndex); !ok {
			continue
		}
		for _, prefix := range []int{64, 1024} {
			for _, tail := range []string{"same", "alternate", "sibling"} {
				b.Run(fmt.Sprintf("impl=%s/prefix=%d/tail=%s", im.name, prefix, tail), func(b *testing.B) {
					applyParallel(b, im.new(), prefix, tail)
				})
			}
		}
	}
}

func applyParallel(b *testing.B, idx radix.Index, prefix int, tail string) {
	end := uint64(prefix - 1) // the prefix's last engine hash
	for i := range 16 {
		if err := idx.Apply(chain(kvevent.Worker{ID: kvevent.WorkerID(i)}, 0, false, 0, prefix, tokensHash)); err != nil {
			b.Fatal(err)
		}
	}
	if tail == "sibling" {
		if err := idx.Apply(chain(kvevent.Worker{ID: 0}, end, true, 1<<40, 1, tokensHash)); err != nil {
			b.Fatal(err)
		}
	}
	var gid atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := gid.Add(1)
		w := kvevent.Worker{ID: kvevent.WorkerID(1000 + g)}
		if err := idx.Apply(chain(w, 0, false, 0, prefix, tokensHash)); err != nil {
			b.Error(err) // Fatal may not be called from RunParallel's goroutines
			return
		}
		// Its own engine hashes, as its own tokens: engines' chain
		// hashes differ where blocks do, and equal hashes here would
		// leave all but one goroutine naming its blocks by names of
		// its own (the index's path for aliases, not its common one).
		var stores, removes [2]kvevent.RouterEvent
		for k := range stores {
			base := uint64(1<<20 + g<<8 + uint64(k)<<7)
			stores[k] = chain(w, end, true, base, 16, func(i int) uint64 { return tokensHash(1<<20 + int(base) + i) })
			removes[k] = removal(stores[k])
		}
		turn := 0 // the tails in turn, or the first alone
		if tail == "alternate" {
			turn = 1
		}
		for k := 0; pb.Next(); k ^= turn {
			if err := idx.Apply(stores[k]); err != nil {
				b.Error(err)
				return
			}
			if err := idx.Apply(removes[k]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(32*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}
