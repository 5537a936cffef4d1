package radix_test

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// stored is worker w's Stored event of the blocks with the given tokens
// hashes, each named by the engine with a hash of its own (here the
// prefix hash, as Dynamo's engines name them).
func stored(w kvevent.WorkerID, id uint64, local []uint64) kvevent.RouterEvent {
	blocks := make([]kvevent.StoredBlock, len(local))
	for i, seq := range hashing.SequenceHashes(nil, local) {
		blocks[i] = kvevent.StoredBlock{BlockHash: seq, TokensHash: local[i]}
	}
	return kvevent.RouterEvent{WorkerID: w, Event: kvevent.Event{ID: id, Data: kvevent.Stored{Blocks: blocks}}}
}

// Workers' KV events build the index; a request's blocks are then scored
// by how many leading blocks each worker holds.
func ExampleCompressedTree() {
	tokens := make([]uint32, 64) // four blocks of 16
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	local := hashing.LocalHashes(nil, tokens, 16, hashing.Options{})

	idx := radix.NewCompressedTree()
	_ = idx.Apply(stored(1, 1, local))     // worker 1 caches the whole prompt
	_ = idx.Apply(stored(2, 1, local[:2])) // worker 2 its first two blocks
	// Worker 1 evicts its last block, naming it by its engine hash.
	last := hashing.SequenceHashes(nil, local)[3]
	_ = idx.Apply(kvevent.RouterEvent{WorkerID: 1, Event: kvevent.Event{ID: 2, Data: kvevent.Removed{BlockHashes: []uint64{last}}}})

	res := idx.FindMatches(local, false)
	for _, w := range slices.SortedFunc(maps.Keys(res.Scores), func(a, b kvevent.Worker) int { return cmp.Compare(a.ID, b.ID) }) {
		fmt.Printf("worker %d: %d blocks of 4 cached, %d held in all\n", w.ID, res.Scores[w], res.TreeSizes[w])
	}
	fmt.Println("pairs held:", idx.Size())
	// Output:
	// worker 1: 3 blocks of 4 cached, 3 held in all
	// worker 2: 2 blocks of 4 cached, 2 held in all
	// pairs held: 5
}
