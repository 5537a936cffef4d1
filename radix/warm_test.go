package radix_test

import (
	"math/rand/v2"
	"runtime/debug"
	"testing"

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
	if testing.Short() || raceEnabled {
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
