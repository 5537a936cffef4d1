package radixtest

import (
	"errors"
	"iter"
	"maps"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// Stored builds a Device-tier Stored event of worker w whose blocks are
// (engine hash, tokens hash) pairs; parent < 0 means the root.
func Stored(w kvevent.Worker, parent int64, pairs ...uint64) kvevent.RouterEvent {
	s := kvevent.Stored{}
	if parent >= 0 {
		s.HasParent, s.ParentHash = true, uint64(parent)
	}
	for i := 0; i+1 < len(pairs); i += 2 {
		s.Blocks = append(s.Blocks, kvevent.StoredBlock{BlockHash: pairs[i], TokensHash: pairs[i+1]})
	}
	return kvevent.RouterEvent{WorkerID: w.ID, Event: kvevent.Event{DPRank: w.DPRank, Data: s}}
}

// Removed builds a Device-tier Removed event.
func Removed(w kvevent.Worker, hashes ...uint64) kvevent.RouterEvent {
	return kvevent.RouterEvent{WorkerID: w.ID, Event: kvevent.Event{DPRank: w.DPRank, Data: kvevent.Removed{BlockHashes: hashes}}}
}

// Cleared builds a Device-tier Cleared event.
func Cleared(w kvevent.Worker) kvevent.RouterEvent {
	return kvevent.RouterEvent{WorkerID: w.ID, Event: kvevent.Event{DPRank: w.DPRank, Data: kvevent.Cleared{}}}
}

// Scores is shorthand for an expected score map.
type Scores = map[kvevent.Worker]uint32

var (
	w1  = kvevent.Worker{ID: 1}
	w2  = kvevent.Worker{ID: 2}
	w1r = kvevent.Worker{ID: 1, DPRank: 1}
)

type step struct {
	ev      *kvevent.RouterEvent
	remove  kvevent.WorkerID
	wantErr error
}

func ev(e kvevent.RouterEvent, wantErr error) step { return step{ev: &e, wantErr: wantErr} }

// Run runs the conformance suite against the index newIndex returns. Every
// radix.Index must pass it.
func Run(t *testing.T, newIndex func() radix.Index) {
	tests := []struct {
		name     string
		steps    []step
		query    []uint64
		want     Scores
		wantSize int
	}{
		{
			name:     "full, partial and no match",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 2, 12, 3), nil), ev(Stored(w2, -1, 20, 1, 21, 2), nil)},
			query:    []uint64{1, 2, 3, 4},
			want:     Scores{w1: 3, w2: 2},
			wantSize: 5,
		},
		{
			name:     "miss at the first block",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil)},
			query:    []uint64{9, 1},
			want:     Scores{},
			wantSize: 1,
		},
		{
			name:     "chain continues through a parent",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, 10, 11, 2), nil)},
			query:    []uint64{1, 2},
			want:     Scores{w1: 2},
			wantSize: 2,
		},
		{
			name:     "unknown parent rejects the whole event",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, 99, 11, 2, 12, 3), radix.ErrParentNotFound)},
			query:    []uint64{1, 2},
			want:     Scores{w1: 1},
			wantSize: 1,
		},
		{
			name:     "another worker's parent is unknown",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w2, 10, 11, 2), radix.ErrParentNotFound)},
			query:    []uint64{1, 2},
			want:     Scores{w1: 1},
			wantSize: 1,
		},
		{
			name:     "storing again is idempotent",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 2), nil), ev(Stored(w1, -1, 10, 1, 11, 2), nil), ev(Stored(w1, 10, 11, 2), nil)},
			query:    []uint64{1, 2},
			want:     Scores{w1: 2},
			wantSize: 2,
		},
		{
			name:     "removal of unknown hashes applies the rest",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 2), nil), ev(Removed(w1, 77, 11, 78), radix.ErrBlockNotFound)},
			query:    []uint64{1, 2},
			want:     Scores{w1: 1},
			wantSize: 1,
		},
		{
			name:     "removing a middle block leaves a hole",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 2, 12, 3), nil), ev(Removed(w1, 11), nil)},
			query:    []uint64{1, 2, 3},
			want:     Scores{w1: 1},
			wantSize: 2,
		},
		{
			// Placeholder hashes count down from 2^64-1; the dump must
			// skip the ones the worker holds.
			name:     "a dump's placeholder for a hole avoids the hashes the worker holds",
			steps:    []step{ev(Stored(w1, -1, math.MaxUint64, 1, 11, 2, math.MaxUint64-1, 3), nil), ev(Removed(w1, 11), nil)},
			query:    []uint64{1, 2, 3},
			want:     Scores{w1: 1},
			wantSize: 2,
		},
		{
			name:     "a hole refilled restores the score",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 2, 12, 3), nil), ev(Removed(w1, 11), nil), ev(Stored(w1, 10, 13, 2), nil)},
			query:    []uint64{1, 2, 3},
			want:     Scores{w1: 3},
			wantSize: 3,
		},
		{
			name:     "cleared drops only that worker and rank",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1r, -1, 10, 1), nil), ev(Stored(w2, -1, 10, 1), nil), ev(Cleared(w1), nil)},
			query:    []uint64{1},
			want:     Scores{w1r: 1, w2: 1},
			wantSize: 2,
		},
		{
			name:     "ranks are separate owners",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 2), nil), ev(Stored(w1r, -1, 10, 1), nil), ev(Removed(w1r, 11), radix.ErrBlockNotFound)},
			query:    []uint64{1, 2},
			want:     Scores{w1: 2, w1r: 1},
			wantSize: 3,
		},
		{
			name:     "remove worker drops every rank",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1r, -1, 10, 1), nil), ev(Stored(w2, -1, 10, 1), nil), {remove: 1}},
			query:    []uint64{1},
			want:     Scores{w2: 1},
			wantSize: 1,
		},
		{
			name:     "a second engine hash for a held block is an alias: removing one keeps the block",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, -1, 50, 1), nil), ev(Removed(w1, 50), nil)},
			query:    []uint64{1},
			want:     Scores{w1: 1},
			wantSize: 1,
		},
		{
			name:     "removing the last alias leaves the block",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, -1, 50, 1), nil), ev(Removed(w1, 10, 50), nil), ev(Removed(w1, 10), radix.ErrBlockNotFound)},
			query:    []uint64{1},
			want:     Scores{},
			wantSize: 0,
		},
		{
			name:     "a Stored names its parent by any alias",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, -1, 50, 1), nil), ev(Stored(w1, 50, 11, 2), nil), ev(Removed(w1, 10), nil)},
			query:    []uint64{1, 2},
			want:     Scores{w1: 2},
			wantSize: 2,
		},
		{
			name:     "an alias moved away leaves the other alias holding the block",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, -1, 50, 1), nil), ev(Stored(w1, -1, 50, 2), nil)},
			query:    []uint64{1},
			want:     Scores{w1: 1},
			wantSize: 2,
		},
		{
			name:     "a block naming itself as its parent rejects the whole event",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, 10, 10, 2), radix.ErrInvalidSequence), ev(Stored(w1, -1, 20, 3, 20, 4), radix.ErrInvalidSequence)},
			query:    []uint64{1, 2},
			want:     Scores{w1: 1},
			wantSize: 1,
		},
		{
			// Hash 12 moves from block 3 to block 1 and back within the
			// second event: block 3 keeps it (found by fuzzing).
			name:     "an engine hash moved away and back within one event stays",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 1, 12, 1), nil), ev(Stored(w1, -1, 12, 1, 13, 1, 12, 1), nil)},
			query:    []uint64{1, 1, 1},
			want:     Scores{w1: 3},
			wantSize: 3,
		},
		{
			// Hash 12 moves from block 3 to 1, back, then on to block 5:
			// block 3 is left (a hole), the others held.
			name:     "an engine hash moved away, back and away again within one event",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 1, 12, 1, 14, 1, 16, 1), nil), ev(Stored(w1, -1, 12, 1, 13, 1, 12, 1, 15, 1, 12, 1), nil), ev(Removed(w1, 12), nil)},
			query:    []uint64{1, 1, 1, 1, 1},
			want:     Scores{w1: 2},
			wantSize: 4,
		},
		{
			name:     "a store under the block the worker's last store ended with, since removed, is rejected",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 2), nil), ev(Removed(w1, 11), nil), ev(Stored(w1, 11, 12, 3), radix.ErrParentNotFound)},
			query:    []uint64{1, 2, 3},
			want:     Scores{w1: 1},
			wantSize: 1,
		},
		{
			// Hash 11 ended the first store at block [1 2], then moved to
			// block [3] in a store that ended elsewhere.
			name:     "a store under a hash a store ended with, since moved to another block, goes under that block",
			steps:    []step{ev(Stored(w1, -1, 10, 1, 11, 2), nil), ev(Stored(w1, -1, 11, 3, 20, 5), nil), ev(Stored(w1, 11, 12, 4), nil)},
			query:    []uint64{3, 4},
			want:     Scores{w1: 2},
			wantSize: 4,
		},
		{
			// Alias 50 ended the second store at block [1], then moved to
			// block [2]; the worker still holds [1] by its own hash.
			name:     "a store under an alias a store ended with, since moved to another block, goes under that block",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, -1, 50, 1), nil), ev(Stored(w1, -1, 50, 2, 60, 3), nil), ev(Stored(w1, 50, 51, 4), nil)},
			query:    []uint64{2, 4},
			want:     Scores{w1: 2},
			wantSize: 4,
		},
		{
			name:     "an engine hash stored at another block moves there",
			steps:    []step{ev(Stored(w1, -1, 10, 1), nil), ev(Stored(w1, -1, 10, 2), nil)},
			query:    []uint64{1},
			want:     Scores{},
			wantSize: 1,
		},
		{
			name: "rank or tier out of range",
			steps: []step{
				ev(Stored(kvevent.Worker{ID: 1, DPRank: kvevent.MaxDPRank + 1}, -1, 10, 1), radix.ErrInvalidEvent),
				ev(Stored(kvevent.Worker{ID: 1, DPRank: ^kvevent.DPRank(0)}, -1, 10, 1), radix.ErrInvalidEvent),
				ev(kvevent.RouterEvent{WorkerID: 1, Tier: kvevent.NumTiers, Event: kvevent.Event{Data: kvevent.Cleared{}}}, radix.ErrInvalidEvent),
				ev(Stored(kvevent.Worker{ID: 1, DPRank: kvevent.MaxDPRank}, -1, 10, 1), nil),
			},
			query:    []uint64{1},
			want:     Scores{{ID: 1, DPRank: kvevent.MaxDPRank}: 1},
			wantSize: 1,
		},
		{
			name:     "event without data",
			steps:    []step{ev(kvevent.RouterEvent{WorkerID: 1}, radix.ErrInvalidEvent)},
			query:    []uint64{1},
			want:     Scores{},
			wantSize: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			idx := newIndex()
			model := NewModel()
			for i, s := range tc.steps {
				if s.ev == nil {
					idx.RemoveWorker(s.remove)
					model.RemoveWorker(s.remove)
					continue
				}
				err := idx.Apply(*s.ev)
				if (s.wantErr == nil) != (err == nil) || (s.wantErr != nil && !errors.Is(err, s.wantErr)) {
					t.Fatalf("step %d: error %v, want %v", i, err, s.wantErr)
				}
				_ = model.Apply(*s.ev)
			}
			got := idx.FindMatches(tc.query, false)
			if !maps.Equal(got.Scores, tc.want) {
				t.Errorf("scores %v, want %v", got.Scores, tc.want)
			}
			if idx.Size() != tc.wantSize {
				t.Errorf("size %d, want %d", idx.Size(), tc.wantSize)
			}
			Check(t, idx, model, tc.query)
		})
	}
	t.Run("early exit gives lower bounds", func(t *testing.T) {
		idx := newIndex()
		mustApply(t, idx, Stored(w1, -1, 10, 1, 11, 2, 12, 3, 13, 4), Stored(w2, -1, 20, 1))
		got := idx.FindMatches([]uint64{1, 2, 3, 4}, true)
		if got.Scores[w2] != 1 || got.Scores[w1] < 2 || got.Scores[w1] > 4 {
			t.Fatalf("scores %v", got.Scores)
		}
		if full := idx.FindMatches([]uint64{1, 2, 3, 4}, false); full.Scores[w1] != 4 {
			t.Fatalf("without early exit: %v", full.Scores)
		}
	})
	t.Run("tree sizes count every block of a scored worker", func(t *testing.T) {
		idx := newIndex()
		mustApply(t, idx, Stored(w1, -1, 10, 1, 11, 2), Stored(w1, -1, 12, 7, 13, 8, 14, 9), Stored(w2, -1, 20, 5))
		got := idx.FindMatches([]uint64{1}, false)
		if !maps.Equal(got.TreeSizes, map[kvevent.Worker]int{w1: 5}) {
			t.Fatalf("tree sizes %v", got.TreeSizes)
		}
	})
	t.Run("empty after every worker is removed", func(t *testing.T) {
		idx := newIndex()
		mustApply(t, idx, Stored(w1, -1, 10, 1, 11, 2), Stored(w2, -1, 20, 1, 21, 3), Stored(w1r, -1, 30, 4), Removed(w1, 10))
		idx.RemoveWorker(1)
		mustApply(t, idx, Cleared(w2))
		if idx.Size() != 0 || len(idx.Dump()) != 0 {
			t.Fatalf("size %d, dump %v", idx.Size(), idx.Dump())
		}
		if got := idx.FindMatches([]uint64{1, 2}, false); len(got.Scores) != 0 {
			t.Fatalf("scores %v", got.Scores)
		}
	})
	t.Run("model", func(t *testing.T) {
		for seed := range uint64(20) {
			RunModel(t, newIndex, seed, 300)
		}
	})
}

func mustApply(t *testing.T, idx radix.Index, evs ...kvevent.RouterEvent) {
	t.Helper()
	for _, e := range evs {
		if err := idx.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
}

// Check compares an index with a model: scores (with tree sizes) for the
// query, size, and the whole held state through the index's Dump.
func Check(t testing.TB, idx radix.Index, model *Model, query []uint64) {
	t.Helper()
	got := idx.FindMatches(query, false)
	want := model.Scores(query)
	if !maps.Equal(got.Scores, want) {
		t.Fatalf("query %v: scores %v, model says %v", query, got.Scores, want)
	}
	checkTreeSizes(t, query, got.TreeSizes, maps.Keys(want), model.TreeSize)
	checkTiers(t, idx, model, query)
	if idx.Size() != model.Size() {
		t.Fatalf("size %d, model says %d", idx.Size(), model.Size())
	}
	dumped, err := FromDump(idx)
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
	if d := dumped.Diff(model); d != "" {
		t.Fatalf("dump differs from the model: %s", d)
	}
}

// checkTreeSizes compares an index's tree sizes of the scored workers
// with the model's.
func checkTreeSizes(t testing.TB, query []uint64, got map[kvevent.Worker]int, scored iter.Seq[kvevent.Worker], size func(kvevent.Worker) int) {
	t.Helper()
	for w := range scored {
		if got[w] != size(w) {
			t.Fatalf("query %v: tree size of %v is %d, model says %d", query, w, got[w], size(w))
		}
	}
}

// RunModel applies a random command stream (seeded) to a fresh index and the
// model, checking them against each other after every step.
func RunModel(t testing.TB, newIndex func() radix.Index, seed uint64, steps int) {
	t.Helper()
	g := &Gen{Src: rand.New(rand.NewPCG(seed, 7)), Model: NewModel()}
	idx := newIndex()
	for i := range steps {
		if !Step(t, idx, g) {
			t.Fatalf("seed %d step %d failed", seed, i)
		}
	}
}

// Step applies the generator's next op to the index and the model, and
// checks them; it reports whether they agree.
func Step(t testing.TB, idx radix.Index, g *Gen) bool {
	t.Helper()
	op := g.Next()
	query := op.Query
	switch op.Kind {
	case OpEvent:
		var merr error
		if g.Ever != nil {
			merr = g.Ever.Apply(g.Model, op.Event)
		} else {
			merr = g.Model.Apply(op.Event)
		}
		err := idx.Apply(op.Event)
		if errors.Is(err, radix.ErrParentNotFound) != errors.Is(merr, radix.ErrParentNotFound) ||
			errors.Is(err, radix.ErrBlockNotFound) != errors.Is(merr, radix.ErrBlockNotFound) {
			t.Errorf("event %+v: index error %v, model error %v", op.Event, err, merr)
			return false
		}
	case OpRemoveWorker:
		idx.RemoveWorker(op.Worker)
		g.Model.RemoveWorker(op.Worker)
	}
	if query == nil {
		query = g.query()
	}
	Check(t, idx, g.Model, query)
	return !t.Failed()
}
