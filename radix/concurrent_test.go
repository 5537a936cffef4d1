package radix_test

import (
	"maps"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
)

// concurrentImpl is one concurrent index with its structural check, which
// returns how many nodes (or runs) it holds.
type concurrentImpl struct {
	name       string
	new        func() radix.ConcurrentIndex
	invariants func(radix.ConcurrentIndex) (int, error)
}

var concurrentImpls = []concurrentImpl{
	{"concurrent", func() radix.ConcurrentIndex { return radix.NewConcurrentTree() },
		func(i radix.ConcurrentIndex) (int, error) {
			return radix.ConcurrentInvariants(i.(*radix.ConcurrentTree))
		}},
	{"compressed", func() radix.ConcurrentIndex { return radix.NewCompressedTree() },
		func(i radix.ConcurrentIndex) (int, error) {
			return radix.CompressedInvariants(i.(*radix.CompressedTree))
		}},
	{"compressed-colliding", func() radix.ConcurrentIndex { return radix.NewCompressedTreeColliding() },
		func(i radix.ConcurrentIndex) (int, error) {
			return radix.CompressedInvariants(i.(*radix.CompressedTree))
		}},
	{"compressed-cramped", func() radix.ConcurrentIndex { return radix.NewCompressedTreeCramped() },
		func(i radix.ConcurrentIndex) (int, error) {
			return radix.CompressedInvariants(i.(*radix.CompressedTree))
		}},
	// Its table reserved up front (16 segments), growing past it as usual.
	{"compressed-sized", func() radix.ConcurrentIndex { return radix.NewCompressedTreeSized(40_000) },
		func(i radix.ConcurrentIndex) (int, error) {
			return radix.CompressedInvariants(i.(*radix.CompressedTree))
		}},
}

// TestConcurrentStructure checks each concurrent index's structure after
// every step of random streams; removing every worker must leave nothing.
func TestConcurrentStructure(t *testing.T) {
	for _, im := range concurrentImpls {
		t.Run(im.name, func(t *testing.T) {
			for seed := range uint64(10) {
				g := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, 2)), Model: radixtest.NewModel()}
				tree := im.new()
				for i := range 400 {
					radixtest.Step(t, tree, g)
					if _, err := im.invariants(tree); err != nil {
						t.Fatalf("seed %d step %d: %v", seed, i, err)
					}
				}
				for id := range kvevent.WorkerID(3) {
					tree.RemoveWorker(id)
				}
				if n, err := im.invariants(tree); n != 0 || err != nil || tree.Size() != 0 {
					t.Fatalf("seed %d: %d nodes, %d pairs left after removing every worker (%v)", seed, n, tree.Size(), err)
				}
			}
		})
	}
}

// TestDifferential applies the same random streams to the baseline and each
// concurrent index and compares their answers to random queries after each
// step, and their whole states through Dump.
//
// A reader races the writer all along (radixtest.RaceReader): no worker
// may be scored for a prefix it never held.
//
// With tiers, the streams' events come in every tier and the tier scores
// are compared too; early exit is compared on device streams only (it
// gives lower bounds, and the other tiers' holders may walk further).
func TestDifferential(t *testing.T) {
	for _, im := range concurrentImpls {
		t.Run(im.name, func(t *testing.T) { differential(t, im.new, false) })
		t.Run(im.name+"/tiers", func(t *testing.T) { differential(t, im.new, true) })
	}
}

func differential(t *testing.T, newIndex func() radix.ConcurrentIndex, tiers bool) {
	for seed := range uint64(30) {
		g := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, 3)), Model: radixtest.NewModel(), Tiers: tiers, Restores: true, ChainHashes: seed%2 == 1}
		base, conc := radix.NewTree(), newIndex()
		ever := &radixtest.EverHeld{}
		stopReader := radixtest.RaceReader(t, conc, ever, seed)
		r := rand.New(rand.NewPCG(seed, 4))
		for step := range 300 {
			op := g.Next()
			switch op.Kind {
			case radixtest.OpEvent:
				_ = ever.Apply(g.Model, op.Event)
				e1, e2 := base.Apply(op.Event), conc.Apply(op.Event)
				if (e1 == nil) != (e2 == nil) {
					stopReader()
					t.Fatalf("seed %d step %d: errors %v vs %v", seed, step, e1, e2)
				}
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
					if early && tiers {
						continue
					}
					a, b := base.FindMatches(q, early), conc.FindMatches(q, early)
					if !maps.Equal(a.Scores, b.Scores) || !maps.Equal(a.TreeSizes, b.TreeSizes) {
						t.Fatalf("seed %d step %d query %v early %v: %v/%v vs %v/%v", seed, step, q, early, a.Scores, a.TreeSizes, b.Scores, b.TreeSizes)
					}
				}
				if ti, ok := conc.(radix.TierIndex); ok && tiers {
					a, b := base.FindTierMatches(q), ti.FindTierMatches(q)
					if !maps.Equal(a.Scores, b.Scores) || !maps.Equal(a.TreeSizes, b.TreeSizes) {
						t.Fatalf("seed %d step %d query %v: tier scores %v/%v vs %v/%v", seed, step, q, a.Scores, a.TreeSizes, b.Scores, b.TreeSizes)
					}
				}
			}
			if base.Size() != conc.Size() {
				t.Fatalf("seed %d step %d: sizes %d vs %d", seed, step, base.Size(), conc.Size())
			}
		}
		stopReader()
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

// TestConcurrentReadersAndWriters runs writers (one goroutine per worker id,
// as the pool guarantees) and readers at once, under -race in CI. Worker i
// only ever stores paths of depth <= 2+i over tokens hashes {1, 2}, so no
// reader may score it higher; at the end the tree must equal each writer's
// own model.
func TestConcurrentReadersAndWriters(t *testing.T) {
	for _, im := range concurrentImpls {
		t.Run(im.name, func(t *testing.T) { readersAndWriters(t, im, false) })
		t.Run(im.name+"/tiers", func(t *testing.T) { readersAndWriters(t, im, true) })
	}
}

// With tiers, two events in five go to the host or disk tier, and the
// readers' tier queries are held to the same bound, cumulative.
func readersAndWriters(t *testing.T, im concurrentImpl, tiers bool) {
	const writers, readers, steps = 4, 4, 2000
	tree := im.new()
	models := make([]*radixtest.Model, writers)
	var wg, rg sync.WaitGroup
	stop := make(chan struct{})
	for i := range writers {
		models[i] = radixtest.NewModel()
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 5))
			m := models[i]
			maxDepth := 2 + i
			for s := range steps {
				w := kvevent.Worker{ID: kvevent.WorkerID(i), DPRank: kvevent.DPRank(r.IntN(2))}
				ev := kvevent.RouterEvent{WorkerID: w.ID, Event: kvevent.Event{ID: uint64(s), DPRank: w.DPRank}}
				if tiers {
					ev.Tier = [...]kvevent.Tier{0, 0, 0, 1, 2}[r.IntN(5)]
				}
				switch c := r.IntN(10); {
				case c < 6:
					var blocks []kvevent.StoredBlock
					for d := range 1 + r.IntN(maxDepth) {
						blocks = append(blocks, kvevent.StoredBlock{BlockHash: uint64(s*16 + d), TokensHash: uint64(1 + r.IntN(2))})
					}
					ev.Event.Data = kvevent.Stored{Blocks: blocks}
				case c < 9:
					hs := m.Hashes(w)
					if len(hs) == 0 {
						continue
					}
					ev.Event.Data = kvevent.Removed{BlockHashes: []uint64{hs[r.IntN(len(hs))]}}
				default:
					ev.Event.Data = kvevent.Cleared{}
				}
				e1, e2 := tree.Apply(ev), m.Apply(ev)
				if (e1 == nil) != (e2 == nil) {
					t.Errorf("worker %v: %v vs model %v", w, e1, e2)
					return
				}
			}
		}()
	}
	for i := range readers {
		rg.Add(1)
		go func() {
			defer rg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 6))
			q := make([]uint64, 10)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for j := range q {
					q[j] = uint64(1 + r.IntN(2))
				}
				for w, s := range tree.FindMatches(q, r.IntN(2) == 0).Scores {
					if int(s) > 2+int(w.ID) || s == 0 {
						t.Errorf("worker %v scored %d on %v", w, s, q)
						return
					}
				}
				ti, ok := tree.(radix.TierIndex)
				if !tiers || !ok {
					continue
				}
				for w, sc := range ti.FindTierMatches(q).Scores {
					for l := range sc {
						if int(sc[l]) > 2+int(w.ID) || (l > 0 && sc[l] < sc[l-1]) || w.DPRank > 1 {
							t.Errorf("worker %v tier scores %v on %v", w, sc, q)
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rg.Wait()
	if _, err := im.invariants(tree); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, m := range models {
		total += m.Size()
		for _, q := range [][]uint64{{1, 1, 1, 1, 1, 1}, {1, 2, 1, 2, 1, 2}, {2, 2, 2, 2, 2, 2}, {2, 1, 1, 2, 2, 1}} {
			got := tree.FindMatches(q, false).Scores
			for w, s := range m.Scores(q) {
				if got[w] != s {
					t.Fatalf("query %v worker %v: %d, model %d", q, w, got[w], s)
				}
			}
		}
	}
	if tree.Size() != total {
		t.Fatalf("size %d, models %d", tree.Size(), total)
	}
}

// A node is 24 bytes, so a map entry (8-byte key + node) is a 32-byte
// allocation: the bytes-per-pair budget rests on it.
func TestNodeLayout(t *testing.T) {
	if radix.CNodeSize != 24 {
		t.Fatalf("cnode is %d bytes, want 24", radix.CNodeSize)
	}
}

// A child-count update that finds no node (only a key collision can lose a
// parent) is cancelled and counted, never applied to a node made up: a zero
// node would claim worker slot 0.
func TestConcurrentChildCountOnAMissingNode(t *testing.T) {
	tr := radix.NewConcurrentTree()
	missing := uint64(0x1234)
	radix.ConcurrentJoinUnder(tr, kvevent.Worker{ID: 7}, 99, missing)
	if tr.Collisions() != 1 || radix.ConcurrentHasNode(tr, missing) {
		t.Fatalf("after a join under a missing parent: %d collisions, parent node made up %v", tr.Collisions(), radix.ConcurrentHasNode(tr, missing))
	}
	radix.ConcurrentLeave(tr, kvevent.Worker{ID: 7}, 99, missing)
	if tr.Collisions() != 2 || radix.ConcurrentHasNode(tr, missing) {
		t.Fatalf("after leaving: %d collisions, parent node made up %v", tr.Collisions(), radix.ConcurrentHasNode(tr, missing))
	}
}

// TestConcurrentWritersOnManyWorkers runs writers on disjoint sets of
// worker ids at once (as pool lanes do), over paths they share, with long
// runs that grow, split, lose their tails and die while other writers
// walk them; readers query throughout. Each writer checks every answer
// against its own model; at the end the index must equal the baseline Tree
// fed every writer's operations, in any order of writers (workers are
// independent), and pass its structural check. Half the writers apply
// their events in batches (ApplyBatch).
func TestConcurrentWritersOnManyWorkers(t *testing.T) {
	for _, im := range concurrentImpls {
		t.Run(im.name, func(t *testing.T) {
			for seed := range uint64(3) {
				manyWriters(t, im, seed)
			}
		})
	}
}

func manyWriters(t *testing.T, im concurrentImpl, seed uint64) {
	const writers, idsEach, steps, batch = 8, 3, 600, 6
	tree := im.new()
	logs := make([][]radixtest.Op, writers)
	var wg, rg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]kvevent.WorkerID, idsEach)
			for i := range ids {
				ids[i] = kvevent.WorkerID(g + i*writers)
			}
			gen := &radixtest.Gen{Src: rand.New(rand.NewPCG(seed, uint64(g))), Model: radixtest.NewModel(), IDs: ids, MaxBlocks: 40, Restores: true, ChainHashes: seed%2 == 1}
			var evs []kvevent.RouterEvent
			var want []error
			flush := func() bool {
				errs := make([]error, len(evs))
				if g%2 == 0 {
					tree.ApplyBatch(evs, errs)
				} else {
					for i, ev := range evs {
						errs[i] = tree.Apply(ev)
					}
				}
				for i := range evs {
					if (errs[i] == nil) != (want[i] == nil) {
						t.Errorf("writer %d event %+v: %v, model %v", g, evs[i], errs[i], want[i])
						return false
					}
				}
				evs, want = evs[:0], want[:0]
				return true
			}
			for range steps {
				op := gen.Next()
				switch op.Kind {
				case radixtest.OpEvent:
					logs[g] = append(logs[g], op)
					evs, want = append(evs, op.Event), append(want, gen.Model.Apply(op.Event))
					if len(evs) == batch && !flush() {
						return
					}
				case radixtest.OpRemoveWorker:
					if !flush() {
						return
					}
					logs[g] = append(logs[g], op)
					tree.RemoveWorker(op.Worker)
					gen.Model.RemoveWorker(op.Worker)
				}
			}
			flush()
		}()
	}
	stop := make(chan struct{})
	for i := range 2 {
		rg.Add(1)
		go func() {
			defer rg.Done()
			r := rand.New(rand.NewPCG(seed, 100+uint64(i)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				q := make([]uint64, r.IntN(60))
				for j := range q {
					q[j] = 1
					if r.IntN(10) == 0 {
						q[j] = uint64(1 + r.IntN(3))
					}
				}
				for w, s := range tree.FindMatches(q, r.IntN(2) == 0).Scores {
					if int(s) > len(q) || s == 0 || int(w.ID) >= writers*idsEach {
						t.Errorf("worker %v scored %d on a %d-block query", w, s, len(q))
						return
					}
				}
			}
		}()
	}
	// A tree that can be resized is, as it grows, while the writers write
	// (resizes of no more than it holds are refused: the sized one's all).
	r, resizable := tree.(interface{ Reserve(int) bool })
	var resized atomic.Int64
	if resizable {
		rg.Add(1)
		go func() {
			defer rg.Done()
			for last := 0; ; runtime.Gosched() {
				select {
				case <-stop:
					return
				default:
				}
				if n := tree.Size(); n > 2*last+64 {
					if r.Reserve(16 * n) {
						resized.Add(1)
					}
					last = n
				}
			}
		}()
	}
	wg.Wait()
	sized := strings.HasSuffix(im.name, "sized") // refuses every resize
	if resizable && !sized {
		// On a busy machine the resizer may first run once the writers
		// are done: it resizes then, and the checks below still hold.
		testwait.For(t, "a resize", func() bool { return resized.Load() > 0 })
	}
	close(stop)
	rg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if _, err := im.invariants(tree); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	base := radix.NewTree()
	for _, log := range logs {
		for _, op := range log {
			switch op.Kind {
			case radixtest.OpEvent:
				_ = base.Apply(op.Event)
			case radixtest.OpRemoveWorker:
				base.RemoveWorker(op.Worker)
			}
		}
	}
	if base.Size() != tree.Size() || base.Size() == 0 {
		t.Fatalf("seed %d: size %d, baseline %d", seed, tree.Size(), base.Size())
	}
	m1, err1 := radixtest.FromDump(base)
	m2, err2 := radixtest.FromDump(tree)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if d := m1.Diff(m2); d != "" {
		t.Fatalf("seed %d: the index differs from the baseline: %s", seed, d)
	}
	for n := range 50 {
		q := make([]uint64, n)
		for j := range q {
			q[j] = 1
		}
		a, b := base.FindMatches(q, false), tree.FindMatches(q, false)
		if !maps.Equal(a.Scores, b.Scores) || !maps.Equal(a.TreeSizes, b.TreeSizes) {
			t.Fatalf("seed %d query of %d: %v/%v, baseline %v/%v", seed, n, b.Scores, b.TreeSizes, a.Scores, a.TreeSizes)
		}
	}
}
