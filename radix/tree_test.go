package radix_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvradix/kvradix/kvevent"

	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
)

func TestTreeConformance(t *testing.T) {
	radixtest.Run(t, func() radix.Index { return radix.NewTree() })
}

func TestTreeTiers(t *testing.T) {
	radixtest.RunTiers(t, func() radix.TierIndex { return radix.NewTree() })
}

func FuzzTree(f *testing.F) {
	fuzzIndex(f, func() radix.Index { return radix.NewTree() })
}

// FuzzTreeTiers runs fuzz-chosen tiered streams against the model.
func FuzzTreeTiers(f *testing.F) {
	fuzzTiers(f, func() radix.TierIndex { return radix.NewTree() }, func(idx radix.TierIndex) error {
		return radix.TreeInvariants(idx.(*radix.Tree))
	})
}

// FuzzConcurrentTreeTiers is FuzzTreeTiers for the concurrent tree.
func FuzzConcurrentTreeTiers(f *testing.F) {
	fuzzTiers(f, func() radix.TierIndex { return radix.NewConcurrentTree() }, func(radix.TierIndex) error { return nil })
}

// fuzzTiers runs fuzz-chosen tiered streams against the model, checking
// the index's structure after every step, with a reader racing them on a
// concurrent index.
func fuzzTiers(f *testing.F, newIndex func() radix.TierIndex, check func(radix.TierIndex) error) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19})
	f.Fuzz(func(t *testing.T, b []byte) {
		src := &radixtest.Bytes{B: b}
		g := &radixtest.Gen{Src: src, Model: radixtest.NewModel(), Tiers: true, Ever: &radixtest.EverHeld{}, Restores: true}
		idx := newIndex()
		defer radixtest.RaceReader(t, idx, g.Ever, uint64(len(b)))()
		for !src.Exhausted() {
			if !radixtest.Step(t, idx, g) {
				return
			}
			if err := check(idx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestTreeStructure runs random streams and checks the tree's links after
// every step; removing every worker must leave no node behind.
func TestTreeStructure(t *testing.T) {
	for seed := range uint64(10) {
		g := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, 1)), Model: radixtest.NewModel()}
		tree := radix.NewTree()
		for i := range 400 {
			radixtest.Step(t, tree, g)
			if err := radix.TreeInvariants(tree); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
		}
		for id := range kvevent.WorkerID(3) {
			tree.RemoveWorker(id)
		}
		if n := radix.TreeNodes(tree); n != 0 || tree.Size() != 0 {
			t.Fatalf("seed %d: %d nodes and %d pairs left after removing every worker", seed, n, tree.Size())
		}
	}
}

func TestConcurrentTreeTiers(t *testing.T) {
	radixtest.RunTiers(t, func() radix.TierIndex { return radix.NewConcurrentTree() })
}

func TestCompressedTreeTiers(t *testing.T) {
	radixtest.RunTiers(t, func() radix.TierIndex { return radix.NewCompressedTree() })
	t.Run("colliding", func(t *testing.T) {
		radixtest.RunTiers(t, func() radix.TierIndex { return radix.NewCompressedTreeColliding() })
	})
	t.Run("cramped", func(t *testing.T) {
		radixtest.RunTiers(t, func() radix.TierIndex { return radix.NewCompressedTreeCramped() })
	})
}

// FuzzCompressedTreeTiers is FuzzTreeTiers for the compressed tree.
func FuzzCompressedTreeTiers(f *testing.F) {
	fuzzTiers(f, func() radix.TierIndex { return radix.NewCompressedTree() }, func(idx radix.TierIndex) error {
		_, err := radix.CompressedInvariants(idx.(*radix.CompressedTree))
		return err
	})
}

func TestConcurrentTreeConformance(t *testing.T) {
	radixtest.Run(t, func() radix.Index { return radix.NewConcurrentTree() })
}

func FuzzConcurrentTree(f *testing.F) {
	fuzzIndex(f, func() radix.Index { return radix.NewConcurrentTree() })
}

func TestCompressedTreeConformance(t *testing.T) {
	radixtest.Run(t, func() radix.Index { return radix.NewCompressedTree() })
	t.Run("colliding", func(t *testing.T) {
		radixtest.Run(t, func() radix.Index { return radix.NewCompressedTreeColliding() })
	})
	t.Run("cramped", func(t *testing.T) {
		radixtest.Run(t, func() radix.Index { return radix.NewCompressedTreeCramped() })
	})
	t.Run("sized", func(t *testing.T) {
		radixtest.Run(t, func() radix.Index { return radix.NewCompressedTreeSized(40_000) })
	})
}

func FuzzCompressedTree(f *testing.F) {
	fuzzIndex(f, func() radix.Index { return radix.NewCompressedTree() })
}

// FuzzCompressedTreeSized fuzzes the compressed tree over a table reserved
// up front (two segments): homes from the hashes' spare bits, computed home
// slots, and reserved segments merged once emptied.
func FuzzCompressedTreeSized(f *testing.F) {
	fuzzIndex(f, func() radix.Index { return radix.NewCompressedTreeSized(3_000) })
}

// FuzzCompressedTreeCramped fuzzes the compressed tree's short runs and
// the workers' own names (NewCompressedTreeCramped).
func FuzzCompressedTreeCramped(f *testing.F) {
	fuzzIndex(f, func() radix.Index { return radix.NewCompressedTreeCramped() })
}

// fuzzIndex decodes each input into a command stream and checks the index
// against the model after every command; a concurrent index has a reader
// racing the stream (radixtest.RaceReader).
func fuzzIndex(f *testing.F, newIndex func() radix.Index) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{1, 1, 3, 0, 2, 2, 2, 1, 1, 10, 1, 0, 0, 0, 14, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &radixtest.Bytes{B: data}
		g := &radixtest.Gen{Src: src, Model: radixtest.NewModel(), Ever: &radixtest.EverHeld{}, Restores: true}
		idx := newIndex()
		defer radixtest.RaceReader(t, idx, g.Ever, uint64(len(data)))()
		for !src.Exhausted() {
			if !radixtest.Step(t, idx, g) {
				return
			}
		}
	})
}

// TestZeroIndexes: the zero value of every index is an empty index that
// works (it used to panic on a nil map), and passes the conformance suite.
func TestZeroIndexes(t *testing.T) {
	for name, newIndex := range map[string]func() radix.Index{
		"tree":       func() radix.Index { return &radix.Tree{} },
		"concurrent": func() radix.Index { return &radix.ConcurrentTree{} },
		"compressed": func() radix.Index { return &radix.CompressedTree{} },
	} {
		t.Run(name, func(t *testing.T) {
			idx := newIndex()
			if got := idx.FindMatches([]uint64{1}, false); len(got.Scores) != 0 || idx.Size() != 0 || len(idx.Dump()) != 0 {
				t.Fatalf("a zero index is not empty: %v", got.Scores)
			}
			idx.RemoveWorker(1)
			radixtest.Run(t, newIndex)
		})
	}
}
