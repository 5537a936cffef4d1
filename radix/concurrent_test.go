package radix_test

import (
	"maps"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
)

// TestConcurrentTreeStructure checks the node map after every step of random
// streams; removing every worker must leave no node.
func TestConcurrentTreeStructure(t *testing.T) {
	for seed := range uint64(10) {
		g := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, 2)), Model: radixtest.NewModel()}
		tree := radix.NewConcurrentTree()
		for i := range 400 {
			radixtest.Step(t, tree, g)
			if _, err := radix.ConcurrentInvariants(tree); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
		}
		for id := range kvevent.WorkerID(3) {
			tree.RemoveWorker(id)
		}
		if n, err := radix.ConcurrentInvariants(tree); n != 0 || err != nil || tree.Size() != 0 {
			t.Fatalf("seed %d: %d nodes, %d pairs left after removing every worker (%v)", seed, n, tree.Size(), err)
		}
	}
}

// TestDifferential applies the same random streams to the baseline and the
// concurrent tree and compares their answers to random queries after each
// step, and their whole states through Dump.
func TestDifferential(t *testing.T) {
	for seed := range uint64(30) {
		g := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, 3)), Model: radixtest.NewModel()}
		base, conc := radix.NewTree(), radix.NewConcurrentTree()
		r := rand.New(rand.NewPCG(seed, 4))
		for step := range 300 {
			op := g.Next()
			switch op.Kind {
			case radixtest.OpEvent:
				e1, e2 := base.Apply(op.Event), conc.Apply(op.Event)
				if (e1 == nil) != (e2 == nil) {
					t.Fatalf("seed %d step %d: errors %v vs %v", seed, step, e1, e2)
				}
				_ = g.Model.Apply(op.Event)
			case radixtest.OpRemoveWorker:
				base.RemoveWorker(op.Worker)
				conc.RemoveWorker(op.Worker)
				g.Model.RemoveWorker(op.Worker)
			}
			for range 5 {
				q := make([]uint64, r.IntN(8))
				for i := range q {
					q[i] = uint64(1 + r.IntN(3))
				}
				for _, early := range []bool{false, true} {
					a, b := base.FindMatches(q, early), conc.FindMatches(q, early)
					if !maps.Equal(a.Scores, b.Scores) || !maps.Equal(a.TreeSizes, b.TreeSizes) {
						t.Fatalf("seed %d step %d query %v early %v: %v/%v vs %v/%v", seed, step, q, early, a.Scores, a.TreeSizes, b.Scores, b.TreeSizes)
					}
				}
			}
			if base.Size() != conc.Size() {
				t.Fatalf("seed %d step %d: sizes %d vs %d", seed, step, base.Size(), conc.Size())
			}
		}
		m1, err1 := radixtest.FromDump(base)
		m2, err2 := radixtest.FromDump(conc)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if d := m1.Diff(m2); d != "" {
			t.Fatalf("seed %d: dumps differ: %s", seed, d)
		}
	}
}

