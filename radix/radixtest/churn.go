package radixtest

import (
	"runtime"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
)

// ChurnIndex is what Churn drives: a radix.Index, or an indexer wrapped to
// apply events synchronously.
type ChurnIndex interface {
	Apply(kvevent.RouterEvent) error
	RemoveWorker(kvevent.WorkerID)
	Size() int
}

// Churn has workers join, store, clear, leave and rejoin in rounds — some
// ids come back, most are new — and checks that the index ends empty with
// the live heap back within slack bytes of where it started: what a worker
// held must be freed when it leaves, whatever the index keeps per worker.
func Churn(t *testing.T, idx ChurnIndex, slack uint64) {
	t.Helper()
	const rounds, workers, blocks, shared = 4, 2000, 100, 20
	before := liveHeap()
	for round := range rounds {
		ids := make([]kvevent.WorkerID, workers)
		for i := range ids {
			// Half the ids of a round were used by the round before.
			ids[i] = kvevent.WorkerID(round*workers/2 + i)
			w := kvevent.Worker{ID: ids[i], DPRank: kvevent.DPRank(i % 2)}
			pairs := make([]uint64, 0, 2*blocks)
			for b := range blocks {
				tok := uint64(b)
				if b >= shared {
					tok = uint64(round*workers+i)<<20 | uint64(b)
				}
				pairs = append(pairs, uint64(i)<<32|uint64(b), tok*0x9E3779B97F4A7C15)
			}
			if err := idx.Apply(Stored(w, -1, pairs...)); err != nil {
				t.Fatal(err)
			}
			if i%3 == 0 {
				if err := idx.Apply(Cleared(w)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, id := range ids {
			idx.RemoveWorker(id)
		}
		if n := idx.Size(); n != 0 {
			t.Fatalf("round %d: %d pairs left after every worker left", round, n)
		}
	}
	after := liveHeap()
	runtime.KeepAlive(idx)
	if after > before+slack {
		t.Fatalf("live heap %d KiB before, %d KiB after every worker left (slack %d KiB)", before>>10, after>>10, slack>>10)
	}
}

func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
