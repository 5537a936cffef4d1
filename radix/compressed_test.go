package radix_test

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
)

// applier is what the indexes and the model have in common.
type applier interface {
	Apply(kvevent.RouterEvent) error
	RemoveWorker(kvevent.WorkerID)
}

// TestCompressedLongRuns exercises runs far longer than a bitset word, in
// the shapes the run layout must get exactly right: a worker holding a
// prefix of another's run, a run split by a diverging store, holes in the
// middle and their refilling, a tail trimmed and regrown differently,
// Cleared and RemoveWorker. Every index is checked against the model (and
// so against the others) after every step, on queries along each path.
func TestCompressedLongRuns(t *testing.T) {
	const n = 200
	path := func(base uint64, k int) []uint64 {
		out := make([]uint64, k)
		for i := range out {
			out[i] = base + uint64(i)
		}
		return out
	}
	a := path(1, n) // the shared run
	b := append(path(1, 70), path(5000, 50)...)
	store := func(w kvevent.Worker, parent int64, engine uint64, toks []uint64) kvevent.RouterEvent {
		pairs := make([]uint64, 0, 2*len(toks))
		for i, tk := range toks {
			pairs = append(pairs, engine+uint64(i), tk)
		}
		return radixtest.Stored(w, parent, pairs...)
	}
	w1, w2, w3 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}, kvevent.Worker{ID: 3, DPRank: 1}
	steps := []func(applier) error{
		func(i applier) error { return i.Apply(store(w1, -1, 1_000_000, a)) },
		func(i applier) error { return i.Apply(store(w2, -1, 2_000_000, a[:90])) },                   // a prefix
		func(i applier) error { return i.Apply(store(w3, -1, 3_000_000, b)) },                        // splits at 70
		func(i applier) error { return i.Apply(radixtest.Removed(w1, 1_000_000+65, 1_000_000+130)) }, // holes
		func(i applier) error { return i.Apply(store(w1, 1_000_000+64, 4_000_000, a[65:66])) },       // refill one
		func(i applier) error { return i.Apply(radixtest.Removed(w1, path(1_000_000+131, 69)...)) },  // tail gone
		func(i applier) error { return i.Apply(store(w1, 1_000_000+129, 6_000_000, path(9000, 80))) },
		func(i applier) error { return i.Apply(radixtest.Cleared(w2)) },
		func(i applier) error { i.RemoveWorker(3); return nil },
		func(i applier) error { return i.Apply(store(w2, -1, 7_000_000, b)) },
	}
	queries := [][]uint64{a, b, append(path(1, 130), path(9000, 80)...), a[:1], a[:64], a[:66]}
	for _, newIndex := range []func() radix.Index{
		func() radix.Index { return radix.NewTree() },
		func() radix.Index { return radix.NewConcurrentTree() },
		func() radix.Index { return radix.NewCompressedTree() },
	} {
		idx, model := newIndex(), radixtest.NewModel()
		for s, step := range steps {
			if err := step(idx); err != nil {
				t.Fatalf("%T step %d: %v", idx, s, err)
			}
			_ = step(model)
			for _, q := range queries {
				radixtest.Check(t, idx, model, q)
			}
		}
		if got := idx.FindMatches(a, false).Scores; got[w1] != 130 {
			t.Fatalf("%T: w1 scores %d on the shared run, want 130 (the hole refilled, 130 removed)", idx, got[w1])
		}
		if c, ok := idx.(*radix.CompressedTree); ok {
			if _, err := radix.CompressedInvariants(c); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Workers storing the same blocks under a shared prefix and evicting
// them, round after round, as engines evict and recompute them: the tree
// stays exact against the model, its invariants hold, and its table purges
// the tombstones the evictions leave, so that no entry sits past more than
// a purge's threshold and a round's evictions (8) of them. Few blocks
// churn, so that the table's own rebuilds (when its used slots reach 7/8)
// come too seldom to hide a missing purge: without purges, entries sit
// past 150-600 tombstones within 150 rounds.
func TestCompressedChurn(t *testing.T) {
	const workers, prefix, tail, rounds = 2, 64, 4, 800
	toks := func(base, n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(base + i)
		}
		return out
	}
	store := func(w kvevent.Worker, parent int64, engine uint64, tk []uint64) kvevent.RouterEvent {
		pairs := make([]uint64, 0, 2*len(tk))
		for i, x := range tk {
			pairs = append(pairs, engine+uint64(i), x)
		}
		return radixtest.Stored(w, parent, pairs...)
	}
	idx, model := radix.NewCompressedTree(), radixtest.NewModel()
	both := func(ev kvevent.RouterEvent) {
		t.Helper()
		if err := idx.Apply(ev); err != nil {
			t.Fatal(err)
		}
		if err := model.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	var queries [][]uint64
	for id := 1; id <= workers; id++ {
		w := kvevent.Worker{ID: kvevent.WorkerID(id)}
		both(store(w, -1, 1_000_000, toks(1, prefix)))
		queries = append(queries, append(toks(1, prefix), toks(10_000*id, tail)...))
	}
	engine := func(id int) uint64 { return uint64(2_000_000 * id) }
	for r := range rounds {
		for id := 1; id <= workers; id++ {
			w := kvevent.Worker{ID: kvevent.WorkerID(id)}
			both(store(w, 1_000_000+prefix-1, engine(id), toks(10_000*id, tail)))
		}
		// Every tail is held: its entries sit past the tombstones the
		// rounds before left.
		if r%50 == 0 || r == rounds-1 {
			for _, q := range queries {
				radixtest.Check(t, idx, model, q)
			}
			if _, err := radix.CompressedInvariants(idx); err != nil {
				t.Fatalf("round %d: %v", r, err)
			}
			if n := radix.ChainTombRun(idx); n > radix.MaxTombs+workers*tail {
				t.Fatalf("round %d: an entry sits past %d tombstones in its probe", r, n)
			}
		}
		for id := 1; id <= workers; id++ {
			hashes := make([]uint64, tail)
			for i := range hashes {
				hashes[i] = engine(id) + uint64(tail-1-i) // tail first, as engines evict
			}
			both(radixtest.Removed(kvevent.Worker{ID: kvevent.WorkerID(id)}, hashes...))
		}
	}
	for _, q := range queries {
		radixtest.Check(t, idx, model, q)
	}
}

// TestAppendMatches checks that AppendMatches appends exactly FindMatches'
// answer after what dst held, and allocates nothing once warm.
func TestAppendMatches(t *testing.T) {
	idx := radix.NewCompressedTree()
	w1, w2 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	for _, ev := range []kvevent.RouterEvent{
		radixtest.Stored(w1, -1, 10, 1, 11, 2, 12, 3),
		radixtest.Stored(w2, -1, 20, 1, 21, 2),
		radixtest.Stored(w2, -1, 30, 7),
	} {
		if err := idx.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	q := []uint64{1, 2, 3}
	prefix := radix.Match{Worker: kvevent.Worker{ID: 99}}
	got := idx.AppendMatches([]radix.Match{prefix}, q, false)
	want := idx.FindMatches(q, false)
	if len(got) != 1+len(want.Scores) || got[0] != prefix {
		t.Fatalf("appended %v to the prefix, want %v", got, want.Scores)
	}
	for _, m := range got[1:] {
		if m.Score != want.Scores[m.Worker] || m.TreeSize != want.TreeSizes[m.Worker] {
			t.Fatalf("match %+v, FindMatches says %d/%d", m, want.Scores[m.Worker], want.TreeSizes[m.Worker])
		}
	}
	if got[1].Worker == got[2].Worker || want.Scores[w1] != 3 || want.TreeSizes[w2] != 3 {
		t.Fatalf("matches %v", got)
	}
	if radix.RaceEnabled {
		return
	}
	buf := make([]radix.Match, 0, 8)
	if n := testing.AllocsPerRun(100, func() { buf = idx.AppendMatches(buf[:0], q, false) }); n != 0 {
		t.Fatalf("AppendMatches allocates %v times a call", n)
	}
}

// A worker that leaves every block, evicting them from the tail a hash an
// event (so that its stripe remembers both it and where its last removal
// left it), is forgotten by its stripe too: nothing keeps its state or its
// runs alive.
func TestCompressedStripeForgets(t *testing.T) {
	idx := radix.NewCompressedTree()
	w := kvevent.Worker{ID: 3}
	hs := make([]uint64, 8)
	blocks := make([]kvevent.StoredBlock, len(hs))
	for i := range hs {
		hs[i] = uint64(1000 + i)
		blocks[i] = kvevent.StoredBlock{BlockHash: hs[i], TokensHash: uint64(7 + i)}
	}
	if err := idx.Apply(kvevent.RouterEvent{WorkerID: w.ID, Event: kvevent.Event{Data: kvevent.Stored{Blocks: blocks}}}); err != nil {
		t.Fatal(err)
	}
	for i := len(hs) - 1; i >= 0; i-- {
		if i == 0 && !radix.StripeRemembers(idx, w) {
			t.Fatal("the stripe remembers nothing of the worker while it still holds a block")
		}
		if err := idx.Apply(kvevent.RouterEvent{WorkerID: w.ID, Event: kvevent.Event{Data: kvevent.Removed{BlockHashes: hs[i : i+1]}}}); err != nil {
			t.Fatal(err)
		}
	}
	if idx.Size() != 0 || radix.StripeRemembers(idx, w) {
		t.Fatalf("size %d; the stripe still points at the forgotten worker: %v", idx.Size(), radix.StripeRemembers(idx, w))
	}
}

// A worker's tips grow with the sequences it decodes (one-block stores
// under the block each sequence's last store ended with) and stay small
// for one storing whole prompts; the stores land where the model says.
func TestCompressedTipsGrowWithSequences(t *testing.T) {
	idx, model := radix.NewCompressedTree(), radixtest.NewModel()
	decoder, prompter := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	const seqs, rounds = 300, 8
	apply := func(ev kvevent.RouterEvent) {
		t.Helper()
		if err := idx.Apply(ev); err != nil {
			t.Fatal(err)
		}
		model.Apply(ev)
	}
	tips := make([]uint64, seqs)
	for s := range tips {
		tips[s] = uint64(1000 + s)
		apply(radixtest.Stored(decoder, -1, tips[s], uint64(s+1)))
		apply(radixtest.Stored(prompter, -1, tips[s]+1<<32, uint64(s+1), tips[s]+2<<32, 7))
	}
	next := uint64(1 << 40)
	for range rounds {
		for s := range tips {
			next++
			apply(radixtest.Stored(decoder, int64(tips[s]), next, next))
			tips[s] = next
		}
	}
	if got := radix.TipSlots(idx, decoder); got < seqs || got > 1024 {
		t.Errorf("a worker decoding %d sequences keeps %d tips, want %d to 1024", seqs, got, seqs)
	}
	if got := radix.TipSlots(idx, prompter); got != 16 {
		t.Errorf("a worker storing prompts keeps %d tips, want 16", got)
	}
	first := []uint64{1} // the first sequence's tokens hashes
	for r := range rounds {
		first = append(first, 1<<40+uint64(r*seqs)+1)
	}
	radixtest.Check(t, idx, model, first)
}

// Stripes are whole cache lines, so that no two share one: a writer
// stripe two, a root stripe one.
func TestCompressedStripeLayout(t *testing.T) {
	if radix.WriterStripeSize != 128 || radix.PaddedMutexSize != 64 {
		t.Fatalf("writer stripe %d bytes, root stripe %d, want 128 and 64", radix.WriterStripeSize, radix.PaddedMutexSize)
	}
}

// A run whose later blocks could not claim their engine hashes (another
// run had them) keeps a claim bitset shorter than the run; trimming it
// past the bitset's end must leave the claims below the trim alone (it
// once cleared them without releasing their table entries).
func TestCompressedTrimPastClaims(t *testing.T) {
	idx, model := radix.NewCompressedTree(), radixtest.NewModel()
	w1, w2 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	pairs := func(engine func(i int) uint64, tok uint64, n int) []uint64 {
		out := make([]uint64, 0, 2*n)
		for i := range n {
			out = append(out, engine(i), tok+uint64(i))
		}
		return out
	}
	shared := func(i int) uint64 { return 1000 + uint64(i) }
	own := func(i int) uint64 {
		if i < 10 {
			return 5000 + uint64(i) // new: claimed by w2's run
		}
		return shared(i) // w1's run has them: not claimed by w2's
	}
	var removed []uint64
	for i := 70; i < 100; i++ {
		removed = append(removed, own(i))
	}
	for _, ev := range []kvevent.RouterEvent{
		radixtest.Stored(w1, -1, pairs(shared, 1, 100)...),
		radixtest.Stored(w2, -1, pairs(own, 500, 100)...), // other tokens: a run of its own
		radixtest.Removed(w2, removed...),                 // trims w2's run to 70
	} {
		if err := idx.Apply(ev); err != nil {
			t.Fatal(err)
		}
		_ = model.Apply(ev)
		if _, err := radix.CompressedInvariants(idx); err != nil {
			t.Fatal(err)
		}
	}
	q := make([]uint64, 100)
	for i := range q {
		q[i] = 500 + uint64(i)
	}
	radixtest.Check(t, idx, model, q)
	idx.RemoveWorker(2)
	idx.RemoveWorker(1)
	if _, err := radix.CompressedInvariants(idx); err != nil || idx.Size() != 0 {
		t.Fatalf("after every worker left: %v, size %d", err, idx.Size())
	}
}

// Engine hashes chosen so that no split can part them (their fingerprints
// share the top bit, and differ below it), in a tree whose table's
// multiplier is known (as if the engines knew it): the table takes a
// segment's worth and refuses the rest, whose blocks the workers name
// themselves. Stores that share prefixes, removals, a Cleared and
// RemoveWorker answer as the model does throughout.
func TestCompressedCraftedFingerprints(t *testing.T) {
	const blocks, per = 4400, 400
	engine := func(i int) uint64 {
		fp := uint64(1)<<(radix.FPBits-1) | uint64(i)*2654435761%(1<<(radix.FPBits-1))
		return radix.FibHash(fp, uint64(i+1)<<8)
	}
	idx, model := radix.NewCompressedTreeKnownMult(), radixtest.NewModel()
	apply := func(ev kvevent.RouterEvent) {
		t.Helper()
		if err := idx.Apply(ev); err != nil {
			t.Fatal(err)
		}
		_ = model.Apply(ev)
	}
	// Workers 1 and 2 store one chain (equal content, equal hashes), 2 only
	// its first half; worker 3 a chain of its own.
	chain := func(w kvevent.Worker, base, n int) {
		for from := 0; from < n; from += per {
			parent := int64(-1)
			if from > 0 {
				parent = int64(engine(base + from - 1))
			}
			pairs := make([]uint64, 0, 2*per)
			for i := from; i < min(from+per, n); i++ {
				pairs = append(pairs, engine(base+i), uint64(base+i))
			}
			apply(radixtest.Stored(w, parent, pairs...))
		}
	}
	w1, w2, w3 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}, kvevent.Worker{ID: 3}
	chain(w1, 0, blocks)
	chain(w2, 0, blocks/2)
	chain(w3, blocks, blocks/2)
	query := func(base, n int) []uint64 {
		q := make([]uint64, n)
		for i := range q {
			q[i] = uint64(base + i)
		}
		return q
	}
	queries := [][]uint64{query(0, blocks), query(0, 10), query(blocks, blocks/2)}
	check := func() {
		t.Helper()
		for _, q := range queries {
			radixtest.Check(t, idx, model, q)
		}
		if _, err := radix.CompressedInvariants(idx); err != nil {
			t.Fatal(err)
		}
	}
	check()
	apply(radixtest.Removed(w1, engine(blocks/2), engine(blocks/2+1))) // a hole past w2's half
	apply(radixtest.Removed(w2, engine(blocks/2-1)))                   // w2's tail
	check()
	apply(radixtest.Cleared(w1))
	check()
	idx.RemoveWorker(3)
	model.RemoveWorker(3)
	check()
	if n := radix.ChainDirSlots(idx); n > 2 {
		t.Fatalf("the table's directory has %d slots for entries no split parts", n)
	}
}

// A run is not extended in place where children hang from its end: a
// third path diverging there gets a child of its own, as the second did,
// rather than the run, whose lock every path through it takes. Before,
// once the path that had extended the run was evicted, the next store
// there extended it again (2 runs, not 3).
func TestCompressedForkKeepsRun(t *testing.T) {
	c := radix.NewCompressedTree()
	w := []kvevent.Worker{{ID: 1}, {ID: 2}, {ID: 3}}
	prefix := []uint64{11, 1, 12, 2, 13, 3, 14, 4} // engine hash, tokens hash
	steps := []kvevent.RouterEvent{
		radixtest.Stored(w[0], -1, prefix...),
		radixtest.Stored(w[1], -1, prefix...),
		radixtest.Stored(w[2], -1, prefix...),
		radixtest.Stored(w[0], 14, 15, 50), // extends the run: nothing hangs there
		radixtest.Stored(w[1], 14, 16, 60), // a child at the run's fourth block
		radixtest.Removed(w[0], 15),        // the run trimmed back to 4 blocks
		radixtest.Stored(w[2], 14, 17, 70), // a child, beside the second's
	}
	for i, ev := range steps {
		if err := c.Apply(ev); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	runs, err := radix.CompressedInvariants(c)
	if err != nil {
		t.Fatal(err)
	}
	if runs != 3 {
		t.Fatalf("%d runs, want 3: the shared run and a child for each of the two paths forking at its end", runs)
	}
	got := c.FindMatches([]uint64{1, 2, 3, 4, 70}, false).Scores
	if want := (radixtest.Scores{w[0]: 4, w[1]: 4, w[2]: 5}); !maps.Equal(got, want) {
		t.Fatalf("scores %v, want %v", got, want)
	}
}

// A store of blocks the worker already holds takes no lock on them: a
// whole request stored again from the root, or from a parent, passes the
// first run (locked here, with its root stripe, as a walk holds them)
// without waiting for it. Before, every store from the root queued on the
// first run's lock, which every request through it shares (16 writers
// waited there 20 of 21.5 s: results/README.md, "Sixteen cores"); this
// test then timed out.
func TestCompressedRestoreTakesNoLock(t *testing.T) {
	c := radix.NewCompressedTree()
	w := kvevent.Worker{ID: 1}
	path := []uint64{11, 1, 12, 2, 23, 30, 24, 31} // engine hash, tokens hash
	for _, ev := range []kvevent.RouterEvent{
		radixtest.Stored(w, -1, 11, 1, 12, 2, 13, 3, 14, 4), // the first run
		radixtest.Stored(w, -1, path...),                    // a child run at its second block
	} {
		if err := c.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	unlock := sync.OnceFunc(radix.LockTopRun(c, 1))
	defer unlock()
	restores := []kvevent.RouterEvent{
		radixtest.Stored(w, -1, path...),
		radixtest.Stored(w, 11, path[2:]...), // from a parent, into the child run
		radixtest.Stored(w, 23, path[6:]...), // from a parent in the child run
		radixtest.Stored(w, -1, 11, 1, 12, 2, 13, 3),
	}
	done := make(chan error, 1)
	go func() {
		for _, ev := range restores {
			if err := c.Apply(ev); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	await(t, done, unlock, "a store of held blocks waited 10 s on the first run's lock")
	unlock()
	if err := c.Apply(radixtest.Stored(w, 14, 15, 5)); err != nil { // extends the run: takes its lock
		t.Fatal(err)
	}
	if _, err := radix.CompressedInvariants(c); err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		keys []uint64
		want int
	}{{[]uint64{1, 2, 30, 31, 9}, 4}, {[]uint64{1, 2, 3, 4, 5}, 5}} {
		if got := c.FindMatches(q.keys, false).Scores[w]; got != uint32(q.want) {
			t.Fatalf("%v: score %d, want %d", q.keys, got, q.want)
		}
	}
	if got := c.Size(); got != 7 {
		t.Fatalf("size %d, want 7", got)
	}
}

// await waits for ch's error, failing on it; after 10 s it unlocks what
// the test locked and fails with msg.
func await(t *testing.T, ch <-chan error, unlock func(), msg string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		unlock()
		t.Fatal(msg)
	}
}

// A store that finds the run it goes on in locked waits for it without
// the parent's lock (or the root stripe), so that other stores through
// the parent go on; and if the run is deleted meanwhile, it looks again
// under the parent. Here w1 goes on into a run only w2 holds, locked;
// while w1 waits, w2 leaves the run, which is deleted (the removal takes
// the parent's lock or the root stripe: held by w1 before, this test then
// timed out); w1 then makes the run anew.
func TestCompressedDescendWaitsUnlocked(t *testing.T) {
	w1, w2 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	for _, tc := range []struct {
		name   string
		before []kvevent.RouterEvent
		locked []uint64 // the path to the run locked
		store  kvevent.RouterEvent
		runs   int
		query  []uint64
		want   radixtest.Scores
	}{{
		name: "child",
		before: []kvevent.RouterEvent{
			radixtest.Stored(w1, -1, 11, 1, 12, 2, 14, 4),
			radixtest.Stored(w2, -1, 11, 1, 12, 2, 13, 3), // a child run at the second block
		},
		locked: []uint64{1, 2, 3},
		store:  radixtest.Stored(w1, 12, 13, 3),
		runs:   2, // the first run and w1's new child
		query:  []uint64{1, 2, 3},
		want:   radixtest.Scores{w1: 3, w2: 2},
	}, {
		name:   "top",
		before: []kvevent.RouterEvent{radixtest.Stored(w2, -1, 13, 3)},
		locked: []uint64{3},
		store:  radixtest.Stored(w1, -1, 13, 3),
		runs:   1,
		query:  []uint64{3},
		want:   radixtest.Scores{w1: 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := radix.NewCompressedTree()
			for _, ev := range tc.before {
				if err := c.Apply(ev); err != nil {
					t.Fatal(err)
				}
			}
			unlock := sync.OnceFunc(radix.LockRunOf(c, tc.locked...))
			hooked := make(chan error, 1)
			radix.SetCompressedHook(c, func(p radix.HookPoint) {
				if p == radix.HookDescend {
					unlock()
					hooked <- c.Apply(radixtest.Removed(w2, 13))
				}
			})
			done := make(chan error, 1)
			go func() { done <- c.Apply(tc.store) }()
			await(t, hooked, unlock, "the store waited 10 s for the run with its parent's lock held")
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			runs, err := radix.CompressedInvariants(c)
			if err != nil {
				t.Fatal(err)
			}
			if runs != tc.runs {
				t.Fatalf("%d runs, want %d", runs, tc.runs)
			}
			if got := c.FindMatches(tc.query, false).Scores; !maps.Equal(got, tc.want) {
				t.Fatalf("scores %v, want %v", got, tc.want)
			}
		})
	}
}

// A run to delete gives up its blocks' table entries under its own lock,
// before drop takes its parent's, which every store and removal through
// the parent takes: between the two (HookSettled) only its first block's
// is left. Before, drop released them all under the parent's lock (7
// entries here, not 4).
func TestCompressedSettleReleasesFirst(t *testing.T) {
	h, w := kvevent.Worker{ID: 3}, kvevent.Worker{ID: 4}
	c := radix.NewCompressedTree()
	for _, ev := range []kvevent.RouterEvent{
		radixtest.Stored(h, -1, 301, 1, 302, 2, 303, 3),
		radixtest.Stored(w, -1, 401, 1, 402, 2, 403, 7, 404, 8, 405, 9, 406, 10), // a child run [7,8,9,10]
	} {
		if err := c.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	settled := -1
	radix.SetCompressedHook(c, func(p radix.HookPoint) {
		if p == radix.HookSettled {
			settled = radix.ChainEntries(c)
		}
	})
	if err := c.Apply(radixtest.Removed(w, 403, 404, 405, 406)); err != nil {
		t.Fatal(err)
	}
	if settled != 4 {
		t.Fatalf("%d entries in the table when the run was settled, want 4: h's 3 and the run's first block's", settled)
	}
	if got := radix.ChainEntries(c); got != 3 {
		t.Fatalf("%d entries left, want h's 3", got)
	}
	if _, err := radix.CompressedInvariants(c); err != nil {
		t.Fatal(err)
	}
}

// A run made by a store is sized once for the event's blocks, though it is
// made with room for one (so that the parent's lock, shared, is not held
// while its arrays are allocated): the walk's first push sizes it.
func TestCompressedRunSizedOnce(t *testing.T) {
	c := radix.NewCompressedTree()
	w := kvevent.Worker{ID: 1}
	for _, ev := range []kvevent.RouterEvent{
		radixtest.Stored(w, -1, 11, 1, 12, 2, 13, 3, 14, 4, 15, 5), // a top-level run
		radixtest.Stored(w, 12, 23, 30, 24, 31, 25, 32),            // a child at its second block
		radixtest.Stored(w, 15, 26, 40),                            // the first run's end: extends it
		radixtest.Stored(w, 13, 27, 50),                            // a child of one block
	} {
		if err := c.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []struct {
		path []uint64
		want int
	}{
		{[]uint64{1}, 10}, // 5, doubled by the extension
		{[]uint64{1, 2, 30}, 3},
		{[]uint64{1, 2, 3, 50}, 1},
	} {
		if got := radix.RunRoom(c, q.path...); got != q.want {
			t.Errorf("run of %v: room for %d blocks, want %d", q.path, got, q.want)
		}
	}
	if _, err := radix.CompressedInvariants(c); err != nil {
		t.Fatal(err)
	}
}

// TestCompressedRunRevived: blocks trimmed from a run's tail and stored
// again by the same hashes are revived in the run's array, not copied with
// the whole run; a block stored there with another engine hash or other
// tokens copies the run, as the array's readers may still read the old
// block.
func TestCompressedRunRevived(t *testing.T) {
	c := radix.NewCompressedTree()
	w, w2 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	apply := func(evs ...kvevent.RouterEvent) {
		t.Helper()
		for _, ev := range evs {
			if err := c.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := radix.CompressedInvariants(c); err != nil {
			t.Fatal(err)
		}
	}
	path := []uint64{1, 2, 3, 4, 5}
	scores := func(want map[kvevent.Worker]uint32) {
		t.Helper()
		if got := c.FindMatches(path, false).Scores; !maps.Equal(got, want) {
			t.Fatalf("scores %v, want %v", got, want)
		}
	}
	apply(radixtest.Stored(w, -1, 11, 1, 12, 2, 13, 3, 14, 4, 15, 5), radixtest.Stored(w2, -1, 11, 1))
	arr := radix.RunArray(c, 1)
	apply(radixtest.Removed(w, 14, 15), radixtest.Stored(w, 13, 14, 4, 15, 5))
	if radix.RunArray(c, 1) != arr {
		t.Fatal("blocks stored again by their hashes copied the run")
	}
	scores(map[kvevent.Worker]uint32{w: 5, w2: 1})
	// Revived blocks are claimed again: the second worker's store by the
	// same hashes holds them by their own hashes, and removals find them.
	apply(radixtest.Stored(w2, 11, 12, 2, 13, 3, 14, 4))
	scores(map[kvevent.Worker]uint32{w: 5, w2: 4})
	apply(radixtest.Removed(w2, 12, 13, 14), radixtest.Removed(w, 15))
	scores(map[kvevent.Worker]uint32{w: 4, w2: 1})

	for _, again := range []kvevent.RouterEvent{
		radixtest.Stored(w, 14, 16, 5), // the same tokens, another engine hash
		radixtest.Stored(w, 14, 15, 6), // other tokens
	} {
		arr := radix.RunArray(c, 1)
		apply(again)
		if radix.RunArray(c, 1) == arr {
			t.Fatalf("%v: a block unlike the array's was written over it", again)
		}
		st := again.Event.Data.(kvevent.Stored)
		apply(radixtest.Removed(w, st.Blocks[0].BlockHash))
	}
}

// TestCompressedTrimmedRunForks: a block unlike the array's stored past
// the length a long run was trimmed to goes on in a child run, not in the
// run copied whole; a short run is copied (TestCompressedRunRevived).
func TestCompressedTrimmedRunForks(t *testing.T) {
	c := radix.NewCompressedTree()
	w, w2 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	const n = 200 // past copyLimitLen
	path := make([]uint64, n)
	var args []uint64
	for i := range path {
		path[i] = uint64(1000 + i)
		args = append(args, uint64(i+1), path[i])
	}
	for _, ev := range []kvevent.RouterEvent{
		radixtest.Stored(w, -1, args...),
		radixtest.Stored(w2, -1, args[:2]...),
		radixtest.Removed(w, 191, 192, 193, 194, 195, 196, 197, 198, 199, 200),
	} {
		if err := c.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	arr := radix.RunArray(c, path[0])
	q := append(slices.Clone(path[:190]), 7)
	if err := c.Apply(radixtest.Stored(w2, 1, args[2:2*190]...)); err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(radixtest.Stored(w, 190, 500, uint64(7))); err != nil {
		t.Fatal(err)
	}
	if radix.RunArray(c, path[0]) != arr {
		t.Fatal("the run was copied")
	}
	if radix.RunArray(c, q...) == arr {
		t.Fatal("the block went on in the run")
	}
	want := map[kvevent.Worker]uint32{w: 191, w2: 190}
	if got := c.FindMatches(q, false).Scores; !maps.Equal(got, want) {
		t.Fatalf("scores %v, want %v", got, want)
	}
	if _, err := radix.CompressedInvariants(c); err != nil {
		t.Fatal(err)
	}
}

// TestCompressedDecodeForks: a decode step's one block past a long run
// whose array is full and last grew for blocks stored together (a prompt,
// stored at once or in chunks) goes on in a child run whose array doubles
// as its sequence decodes, not in the prompt's run doubled. A short run,
// a run with room left, and blocks stored together (a conversation's
// next turn) extend the run as before, and a long decode stays in its
// child run.
func TestCompressedDecodeForks(t *testing.T) {
	w := kvevent.Worker{ID: 1}
	decode := func(n int) []int { return slices.Repeat([]int{1}, n) } // n decode steps
	for _, tc := range []struct {
		name    string
		prompt  []int // the events that store the prompt, their blocks
		then    []int // the events stored after it, their blocks
		forks   bool  // those go on in a child run
		copied  bool  // the prompt's array is replaced (doubled)
		roomFor int   // the room the last block's run has
	}{
		{"long prompt stored at once", []int{200}, decode(20), true, false, 32},
		{"long prompt in chunks", []int{100, 100}, decode(20), true, false, 32},
		{"long decode", []int{200}, decode(100), true, false, 128},
		{"short prompt", []int{20}, decode(20), false, true, 40},
		{"room left", []int{100, 50}, decode(20), false, false, 200},
		{"a turn, not a decode step", []int{200}, []int{50}, false, true, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := radix.NewCompressedTree()
			var path []uint64
			parent := int64(-1)
			store := func(n int) {
				t.Helper()
				var args []uint64
				for range n {
					k := uint64(len(path) + 1)
					path, args = append(path, k), append(args, k<<32, k) // engine hash, tokens hash
				}
				if err := c.Apply(radixtest.Stored(w, parent, args...)); err != nil {
					t.Fatal(err)
				}
				parent = int64(args[len(args)-2])
			}
			for _, n := range tc.prompt {
				store(n)
			}
			prompt, n := radix.RunArray(c, path[:1]...), len(path)
			for _, n := range tc.then {
				store(n)
			}
			if copied := radix.RunArray(c, path[:1]...) != prompt; copied != tc.copied {
				t.Errorf("prompt's array replaced: %v, want %v", copied, tc.copied)
			}
			last := radix.RunArray(c, path...)
			if forks := last != radix.RunArray(c, path[:1]...); forks != tc.forks {
				t.Errorf("in a child run: %v, want %v", forks, tc.forks)
			}
			if radix.RunArray(c, path[:n+1]...) != last {
				t.Error("the blocks stored after the prompt are in more than one run")
			}
			if got := radix.RunRoom(c, path...); got != tc.roomFor {
				t.Errorf("the last block's run has room for %d blocks, want %d", got, tc.roomFor)
			}
			if got, want := c.FindMatches(path, false).Scores, (radixtest.Scores{w: uint32(len(path))}); !maps.Equal(got, want) {
				t.Fatalf("scores %v, want %v", got, want)
			}
			if _, err := radix.CompressedInvariants(c); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCompressedRunIDsBounded: run ids made by the writers of one stripe
// and freed by another's go back to the table, so that the ids handed out
// stay within the live runs and the stripes' spares, however many runs
// come and go.
func TestCompressedRunIDsBounded(t *testing.T) {
	c := radix.NewCompressedTree()
	maker, freer := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2} // stripes 1 and 2
	for i := range uint64(5000) {
		// The maker makes a top-level run of two blocks (tokens i and
		// i+2^40) and leaves it; the freer, holding it too, leaves it
		// last, and deletes it.
		for _, ev := range []kvevent.RouterEvent{
			radixtest.Stored(maker, -1, 10*i+1, i, 10*i+2, i+1<<40),
			radixtest.Stored(freer, -1, 10*i+1, i, 10*i+2, i+1<<40),
			radixtest.Removed(maker, 10*i+1, 10*i+2),
			radixtest.Removed(freer, 10*i+1, 10*i+2),
		} {
			if err := c.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	handed, live := radix.RunIDs(c)
	if live != 0 || handed > radix.SpareRunIDs+radix.RunIDBatch {
		t.Fatalf("%d ids handed out for %d live runs (at most %d spare)", handed, live, radix.SpareRunIDs)
	}
}

// A store that makes a child of a position its worker holds, and the
// removal that deletes that child, do not take the parent's lock: siblings
// made and deleted under one shared run (new conversations under a system
// prompt) queued on it, 16 writers no faster than 4 (results/README.md,
// "Again at c4a34a2"). Here the shared run [1,2,3] is locked throughout
// (w2 holds all of it, w1 [1,2]), so w1's [4,5] goes on in a child of
// position 2. Before, this test timed out.
func TestCompressedSiblingsWithoutParentLock(t *testing.T) {
	w1, w2 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	c := radix.NewCompressedTree()
	for _, ev := range []kvevent.RouterEvent{
		radixtest.Stored(w1, -1, 11, 1, 12, 2),
		radixtest.Stored(w2, -1, 11, 1, 12, 2, 13, 3),
	} {
		if err := c.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	unlock := sync.OnceFunc(radix.LockRunOf(c, 1, 2))
	done := make(chan error, 1)
	go func() {
		for range 3 {
			if err := c.Apply(radixtest.Stored(w1, 12, 14, 4, 15, 5)); err != nil {
				done <- err
				return
			}
			if got, want := c.FindMatches([]uint64{1, 2, 4, 5}, false).Scores, (radixtest.Scores{w1: 4, w2: 2}); !maps.Equal(got, want) {
				done <- fmt.Errorf("scores %v, want %v", got, want)
				return
			}
			if err := c.Apply(radixtest.Removed(w1, 15, 14)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	await(t, done, unlock, "the store or removal of a child waited 10 s for its parent's lock")
	unlock()
	if runs, err := radix.CompressedInvariants(c); err != nil || runs != 1 {
		t.Fatalf("%d runs (want 1), %v", runs, err)
	}
}

// One more child of a position where children hang is counted without
// the run's lock, and checked after the count against the run's blocks
// read then: read before, they may be gone, and the block the store's own
// next. Here w4 (b) finds [1,2,3,40] with a child [60] at 3 and no child
// [50]; before it counts one, [60] and 40 go, w5 extends the run by 50
// in place and w6 hangs [61] at 3. b's count, from [61]'s, must see 50:
// b holds the run's own next block, not a child duplicating it.
func TestCompressedBranchChecksAfterCount(t *testing.T) {
	h, a, k, b, w, k2 := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}, kvevent.Worker{ID: 3}, kvevent.Worker{ID: 4}, kvevent.Worker{ID: 5}, kvevent.Worker{ID: 6}
	c := radix.NewCompressedTree()
	apply := func(evs ...kvevent.RouterEvent) error {
		for _, ev := range evs {
			if err := c.Apply(ev); err != nil {
				return err
			}
		}
		return nil
	}
	prefix := func(w kvevent.Worker) kvevent.RouterEvent { return radixtest.Stored(w, -1, 101, 1, 102, 2, 103, 3) }
	if err := apply(prefix(h), radixtest.Stored(a, -1, 101, 1, 102, 2, 103, 3, 1040, 40),
		prefix(k), radixtest.Stored(k, 103, 1060, 60), prefix(b), prefix(k2)); err != nil {
		t.Fatal(err)
	}
	var hooked error
	first := true // k2's store looks for a child too, within b's
	radix.SetCompressedHook(c, func(p radix.HookPoint) {
		if p == radix.HookBranch && first {
			first = false
			hooked = apply(radixtest.Removed(k, 1060), radixtest.Removed(a, 1040),
				radixtest.Stored(w, -1, 101, 1, 102, 2, 103, 3, 1050, 50), radixtest.Stored(k2, 103, 1061, 61))
		}
	})
	if err := apply(radixtest.Stored(b, 103, 1050, 50)); err != nil || hooked != nil {
		t.Fatal(err, hooked)
	}
	branchedTree(t, c, 2, radixtest.Scores{h: 3, a: 3, k: 3, b: 4, w: 4, k2: 3})
}

// At a run's end a child is counted without the run's lock only from a
// count above zero: a walk holding the lock that saw no child there
// extends the run in place, and publishes its blocks only when it leaves
// the run. Here w4 (b) finds [1,2,3] with a child [70] at its end; before
// b counts a child [50], [70] goes, and w5 extends the run by 50 in place
// and stops before it publishes. b must wait for the run's lock, then hold
// its 50, not hang a child [50] beside it.
func TestCompressedBranchAtEndCountsFromOne(t *testing.T) {
	h, a, k, b, w := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}, kvevent.Worker{ID: 3}, kvevent.Worker{ID: 4}, kvevent.Worker{ID: 5}
	c := radix.NewCompressedTree()
	prefix := func(w kvevent.Worker) kvevent.RouterEvent { return radixtest.Stored(w, -1, 101, 1, 102, 2, 103, 3) }
	for _, ev := range []kvevent.RouterEvent{prefix(h), radixtest.Stored(a, -1, 101, 1, 102, 2, 103, 3, 1040, 40),
		prefix(k), radixtest.Stored(k, 103, 1070, 70), radixtest.Removed(a, 1040), prefix(b)} { // [70] at the end of [1,2,3]
		if err := c.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	atBranch, goBranch, left, goLeave, waited := make(chan error, 1), make(chan struct{}), make(chan error, 1), make(chan struct{}), make(chan error, 1)
	var branched, leaving, waiting atomic.Bool // the first of each stops
	radix.SetCompressedHook(c, func(p radix.HookPoint) {
		switch {
		case p == radix.HookBranch && branched.CompareAndSwap(false, true):
			atBranch <- nil
			<-goBranch
		case p == radix.HookLeave && leaving.CompareAndSwap(false, true):
			left <- nil
			<-goLeave
		case p == radix.HookDescend && waiting.CompareAndSwap(false, true):
			waited <- nil
		}
	})
	openBranch, openLeave := sync.OnceFunc(func() { close(goBranch) }), sync.OnceFunc(func() { close(goLeave) })
	release := func() { openBranch(); openLeave() }
	defer release()
	r := raceBranch(t, c, b, w, atBranch, release, "b never looked for a child at the run's end", radixtest.Removed(k, 1070))
	await(t, left, release, "w never left the run it extends")
	openBranch()
	select { // b waits for the run's lock, held by w (or, wrongly, is done)
	case <-waited:
	case err := <-r.bDone:
		r.bDone <- err
	case <-time.After(10 * time.Second):
		t.Fatal("b neither waited for the run's lock nor finished")
	}
	openLeave()
	r.finish(t)
	branchedTree(t, c, 1, radixtest.Scores{h: 3, a: 3, k: 3, b: 4, w: 4})
}

// A run keeps counts of children only for positions children hang from,
// and for those whose last child went since the last new one: a child
// made and deleted at each position of a long shared run in turn leaves
// the run counting two positions at most, not one for every position a
// child ever hung from.
func TestCompressedKidPositionsBounded(t *testing.T) {
	h, w := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}
	const n = 64
	var path []uint64
	for i := range uint64(n) {
		path = append(path, 100+i, i+1)
	}
	c := radix.NewCompressedTree()
	for _, wk := range []kvevent.Worker{h, w} {
		if err := c.Apply(radixtest.Stored(wk, -1, path...)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range int64(n - 1) {
		if err := c.Apply(radixtest.Stored(w, 100+i, 5000, 5000)); err != nil {
			t.Fatal(err)
		}
		if got := radix.KidPositions(c, 1); got > 2 {
			t.Fatalf("after a child at position %d the run counts children at %d positions, want at most 2", i, got)
		}
		if err := c.Apply(radixtest.Removed(w, 5000)); err != nil {
			t.Fatal(err)
		}
	}
	if runs, err := radix.CompressedInvariants(c); err != nil || runs != 1 {
		t.Fatalf("%d runs (want 1), %v", runs, err)
	}
}

// A run's first child at a position is checked and counted under the
// run's kids lock, and a walk about to extend the run in place looks for
// children under it too: the walk's look comes before the check, or after
// the count. Here w4 (b) finds 40 after position 3 of [1,2,3,40] and
// [50] a child, and stops between its check and its count; 40 goes, and
// w5's walk from the root reaches the run's new end to store 50 there. It
// must wait for b's count and go on in b's child, not extend the run by
// 50 beside it.
func TestCompressedFirstChildBeforeExtension(t *testing.T) {
	h, a, b, w := kvevent.Worker{ID: 1}, kvevent.Worker{ID: 2}, kvevent.Worker{ID: 4}, kvevent.Worker{ID: 5}
	c := radix.NewCompressedTree()
	for _, ev := range []kvevent.RouterEvent{radixtest.Stored(h, -1, 101, 1, 102, 2, 103, 3),
		radixtest.Stored(a, -1, 101, 1, 102, 2, 103, 3, 1040, 40), radixtest.Stored(b, -1, 101, 1, 102, 2, 103, 3)} {
		if err := c.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	atCount, goCount := make(chan error, 1), make(chan struct{})
	open := sync.OnceFunc(func() { close(goCount) })
	defer open()
	var counting atomic.Bool
	radix.SetCompressedHook(c, func(p radix.HookPoint) {
		if p == radix.HookFirstKid && counting.CompareAndSwap(false, true) {
			atCount <- nil
			<-goCount
		}
	})
	r := raceBranch(t, c, b, w, atCount, open, "b never counted a first child", radixtest.Removed(a, 1040))
	// w waits for the kids lock (or, wrongly, is done).
	for deadline := time.Now().Add(10 * time.Second); !blockedIn("sync.Mutex.Lock", "(*crun).hasKids"); {
		if err := waitOr(r.wDone, time.Millisecond); err != errNotYet {
			r.wDone <- err
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("w neither waited for the kids lock nor finished")
		}
	}
	open()
	r.finish(t)
	branchedTree(t, c, 2, radixtest.Scores{h: 3, a: 3, b: 4, w: 4})
}

// branchRace is the schedule the branch tests share: b stores [50] under
// [1,2,3] (engine hash 1050 under 103) on a goroutine of its own, and a
// hook of the test stops it (stopped says so); removal is applied, and w
// stores [1,2,3,50] from the root on another goroutine. Each store's
// error comes on its channel.
type branchRace struct{ bDone, wDone chan error }

func raceBranch(t *testing.T, c *radix.CompressedTree, b, w kvevent.Worker, stopped <-chan error, release func(), msg string, removal kvevent.RouterEvent) branchRace {
	t.Helper()
	r := branchRace{make(chan error, 1), make(chan error, 1)}
	go func() { r.bDone <- c.Apply(radixtest.Stored(b, 103, 1050, 50)) }()
	await(t, stopped, release, msg)
	if err := c.Apply(removal); err != nil {
		t.Fatal(err)
	}
	go func() { r.wDone <- c.Apply(radixtest.Stored(w, -1, 101, 1, 102, 2, 103, 3, 1050, 50)) }()
	return r
}

// finish waits for both stores.
func (r branchRace) finish(t *testing.T) {
	t.Helper()
	await(t, r.bDone, func() {}, "b's store never finished")
	await(t, r.wDone, func() {}, "w's store never finished")
}

// branchedTree checks that c is well formed with runs runs, and scores
// [1,2,3,50] as want.
func branchedTree(t *testing.T, c *radix.CompressedTree, runs int, want radixtest.Scores) {
	t.Helper()
	if got, err := radix.CompressedInvariants(c); err != nil || got != runs {
		t.Fatalf("%d runs (want %d), %v", got, runs, err)
	}
	if got := c.FindMatches([]uint64{1, 2, 3, 50}, false).Scores; !maps.Equal(got, want) {
		t.Fatalf("scores %v, want %v", got, want)
	}
}

// errNotYet is waitOr's answer when nothing came.
var errNotYet = errors.New("not yet")

// waitOr returns what ch gives within d, or errNotYet.
func waitOr(ch <-chan error, d time.Duration) error {
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		return errNotYet
	}
}

// blockedIn reports whether a goroutine waits with the wait reason given
// (as its stack's header says it) in a call of fn.
func blockedIn(reason, fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if header, _, _ := strings.Cut(g, "\n"); strings.Contains(header, "["+reason) && strings.Contains(g, fn) {
			return true
		}
	}
	return false
}
