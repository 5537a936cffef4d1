package bench

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

type indexImpl struct {
	name string
	new  func() radix.Index
}

var indexImpls = []indexImpl{
	{"tree", func() radix.Index { return radix.NewTree() }},
	{"concurrent", func() radix.Index { return radix.NewConcurrentTree() }},
	{"compressed", func() radix.Index { return radix.NewCompressedTree() }},
}

// chain returns a Stored event of w: blocks engine hashes base+i, tokens
// hashes tok(i), under parent (if hasParent).
func chain(w kvevent.Worker, parent uint64, hasParent bool, base uint64, n int, tok func(i int) uint64) kvevent.RouterEvent {
	s := kvevent.Stored{HasParent: hasParent, ParentHash: parent, Blocks: make([]kvevent.StoredBlock, n)}
	for i := range s.Blocks {
		s.Blocks[i] = kvevent.StoredBlock{BlockHash: base + uint64(i), TokensHash: tok(i)}
	}
	return kvevent.RouterEvent{WorkerID: w.ID, Event: kvevent.Event{DPRank: w.DPRank, Data: s}}
}

func removal(ev kvevent.RouterEvent) kvevent.RouterEvent {
	st := ev.Event.Data.(kvevent.Stored)
	hs := make([]uint64, len(st.Blocks))
	for i, b := range st.Blocks {
		hs[i] = b.BlockHash
	}
	return kvevent.RouterEvent{WorkerID: ev.WorkerID, Event: kvevent.Event{DPRank: ev.Event.DPRank, Data: kvevent.Removed{BlockHashes: hs}}}
}

// tokensHash spreads small integers over the hash space, as real tokens
// hashes are.
func tokensHash(i int) uint64 { return uint64(i+1) * 0x9E3779B97F4A7C15 }

// BenchmarkApply measures event application: each iteration stores an
// event of n blocks (under a 32-block parent chain or at the root) and then
// removes it, so the index stays the same size. blocks/s counts both.
func BenchmarkApply(b *testing.B) {
	for _, im := range indexImpls {
		for _, n := range []int{1, 16, 128} {
			for _, parent := range []bool{false, true} {
				b.Run(fmt.Sprintf("impl=%s/blocks=%d/parent=%v", im.name, n, parent), func(b *testing.B) {
					idx := im.new()
					w := kvevent.Worker{ID: 1}
					// Other workers share the tree, as in a fleet.
					for o := range 16 {
						if err := idx.Apply(chain(kvevent.Worker{ID: kvevent.WorkerID(100 + o)}, 0, false, 0, 64, tokensHash)); err != nil {
							b.Fatal(err)
						}
					}
					if err := idx.Apply(chain(w, 0, false, 1<<40, 32, tokensHash)); err != nil {
						b.Fatal(err)
					}
					store := chain(w, 1<<40+31, parent, 1<<50, n, func(i int) uint64 { return tokensHash(i + 1000) })
					if !parent {
						store = chain(w, 0, false, 1<<50, n, func(i int) uint64 { return tokensHash(i + 1000) })
					}
					remove := removal(store)
					b.ReportAllocs()
					for b.Loop() {
						if err := idx.Apply(store); err != nil {
							b.Fatal(err)
						}
						if err := idx.Apply(remove); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(2*n)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
				})
			}
		}
	}
}

// findSetup builds an index in which `workers` workers hold a chain of
// `depth` blocks: all of it (match=hit), or worker i the first
// (i+1)·depth/workers blocks (match=partial); match=miss queries a path
// whose first block nobody holds.
func findSetup(b *testing.B, idx radix.Index, match string, depth, workers int) []uint64 {
	for i := range workers {
		n := depth
		if match == "partial" {
			n = max(1, (i+1)*depth/workers)
		}
		if err := idx.Apply(chain(kvevent.Worker{ID: kvevent.WorkerID(i)}, 0, false, 0, n, tokensHash)); err != nil {
			b.Fatal(err)
		}
	}
	q := make([]uint64, depth)
	for i := range q {
		q[i] = tokensHash(i)
	}
	if match == "miss" {
		q[0] = 42
	}
	return q
}

// BenchmarkFindMatches measures one overlap query on one goroutine.
// blocks/s counts the request's blocks.
func BenchmarkFindMatches(b *testing.B) {
	for _, match := range []string{"hit", "miss", "partial"} {
		for _, depth := range []int{16, 128, 1024} {
			for _, workers := range []int{4, 64, 1024} {
				for _, im := range indexImpls {
					b.Run(fmt.Sprintf("impl=%s/match=%s/depth=%d/workers=%d", im.name, match, depth, workers), func(b *testing.B) {
						idx := im.new()
						q := findSetup(b, idx, match, depth, workers)
						runtime.GC()
						b.ReportAllocs()
						for b.Loop() {
							idx.FindMatches(q, false)
						}
						b.ReportMetric(float64(depth)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
					})
				}
			}
		}
	}
}
