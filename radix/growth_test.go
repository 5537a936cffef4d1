package radix_test

import (
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"testing"
	"time"

	"github.com/kvradix/kvradix/internal/pages"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
)

// A grown tree warms the heap ahead of its growth (pages.WarmAhead) once
// its table of engine hashes doubles past 92 segments: stored blocks, 256
// an event, start one before 4M of them (the first doubling past 92
// segments comes at about 370,000, and each later one is another chance
// where the heap's free pages happen to be resident already). The warm
// ends on its own, and the tree holds every block stored.
func TestCompressedWarmsAhead(t *testing.T) {
	if testing.Short() || radix.RaceEnabled {
		t.Skip("stores millions of blocks")
	}
	const per, most = 256, 4 << 20
	debug.FreeOSMemory() // the heap's free pages released: worth warming
	before := pages.Started()
	idx := radix.NewCompressedTree()
	rng := rand.New(rand.NewPCG(5, 6))
	w := kvevent.Worker{ID: 1}
	stored := 0
	for ; stored < most && pages.Started() == before; stored += per {
		pairs := make([]uint64, 0, 2*per)
		for range per {
			pairs = append(pairs, rng.Uint64(), rng.Uint64())
		}
		if err := idx.Apply(radixtest.Stored(w, -1, pairs...)); err != nil {
			t.Fatal(err)
		}
	}
	if pages.Started() == before {
		t.Fatalf("no warm started after %d blocks stored", stored)
	}
	testwait.For(t, "the warm to end", func() bool { return !pages.Warming() })
	if got := idx.Size(); got != stored {
		t.Fatalf("the tree holds %d blocks after %d stored", got, stored)
	}
	t.Logf("a warm started after %d blocks stored", stored)
}

// BenchmarkCompressedReserve resizes a grown tree holding blocks distinct
// blocks (one worker, 256 an event) for four times as many, as
// CompressedTree.Reserve does: ns/block is a held block's share of the
// resize, wait-ns/block its share of the part stores and removals wait
// for, which reads each block's engine hash and moves its entry (the rest
// makes the new table resident first).
func BenchmarkCompressedReserve(b *testing.B) {
	for _, blocks := range []int{1 << 16, 1 << 20} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(7, 8))
			evs := make([]kvevent.RouterEvent, 0, blocks/256)
			for range blocks / 256 {
				pairs := make([]uint64, 0, 512)
				for range 256 {
					pairs = append(pairs, rng.Uint64(), rng.Uint64())
				}
				evs = append(evs, radixtest.Stored(kvevent.Worker{ID: 1}, -1, pairs...))
			}
			var waited time.Duration
			for b.Loop() {
				b.StopTimer()
				idx := radix.NewCompressedTree()
				for _, ev := range evs {
					if err := idx.Apply(ev); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				wait, ok := idx.ReserveWait(4 * blocks)
				if !ok {
					b.Fatal("the resize was refused")
				}
				waited += wait
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(blocks), "ns/block")
			b.ReportMetric(float64(waited.Nanoseconds())/float64(b.N)/float64(blocks), "wait-ns/block")
		})
	}
}
