package shardpool_test

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// A Pool applies each worker's events in order on lanes of their own while
// queries read the index concurrently; Flush waits for what was queued.
func ExamplePool() {
	p := shardpool.NewPool(2, 16) // two lanes over a CompressedTree, 16-token blocks
	defer p.Close()

	prompt := make([]uint32, 48) // three blocks
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	local := hashing.LocalHashes(nil, prompt, p.BlockSize(), hashing.Options{})
	seq := hashing.SequenceHashes(nil, local)
	for w, n := range []int{3, 1} { // worker 0 caches all three blocks, worker 1 the first
		var blocks []kvevent.StoredBlock
		for i := range n {
			blocks = append(blocks, kvevent.StoredBlock{BlockHash: seq[i], TokensHash: local[i]})
		}
		ev := kvevent.RouterEvent{WorkerID: kvevent.WorkerID(w), Event: kvevent.Event{ID: 1, Data: kvevent.Stored{Blocks: blocks}}}
		if err := p.ApplyEvent(ev); err != nil {
			fmt.Println(err)
		}
	}
	if _, err := p.Flush(); err != nil {
		fmt.Println(err)
	}

	res, err := p.FindMatchesForRequest(prompt, "")
	if err != nil {
		fmt.Println(err)
	}
	for _, w := range slices.SortedFunc(maps.Keys(res.Scores), func(a, b kvevent.Worker) int { return cmp.Compare(a.ID, b.ID) }) {
		fmt.Printf("worker %d: %d of %d blocks\n", w.ID, res.Scores[w], len(local))
	}
	fmt.Println("events applied:", p.Stats().Applied)
	// Output:
	// worker 0: 3 of 3 blocks
	// worker 1: 1 of 3 blocks
	// events applied: 2
}
