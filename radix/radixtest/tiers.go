package radixtest

import (
	"errors"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// In returns ev in tier t.
func In(t kvevent.Tier, ev kvevent.RouterEvent) kvevent.RouterEvent {
	ev.Tier = t
	return ev
}

// TierScores is shorthand for expected cumulative tier scores.
type TierScores = map[kvevent.Worker][kvevent.NumTiers]uint32

const (
	dev  = kvevent.TierDevice
	host = kvevent.TierHostPinned
	disk = kvevent.TierDisk
	ext  = kvevent.TierExternal
)

// RunTiers runs the tier conformance suite against an index that keeps
// tiers (radix.TierIndex): directed cases of offloading, holes one tier
// fills, parents held in another tier, per-tier removal and clearing, and
// random tiered streams checked against the model after every step.
func RunTiers(t *testing.T, newIndex func() radix.TierIndex) {
	pool := kvevent.Worker{ID: 100}
	tests := []struct {
		name   string
		groups map[kvevent.Worker][]kvevent.Worker
		steps  []step
		query  []uint64
		want   TierScores
	}{
		{
			name: "offloaded: removed from the device, stored on the host",
			steps: []step{ev(Stored(w1, -1, 10, 1, 11, 2, 12, 3), nil), ev(In(host, Stored(w1, 10, 11, 2, 12, 3)), nil),
				ev(Removed(w1, 11, 12), nil)},
			query: []uint64{1, 2, 3},
			want:  TierScores{w1: {1, 3, 3, 3}},
		},
		{
			name: "a hole on the device the host fills",
			steps: []step{ev(Stored(w1, -1, 10, 1, 11, 2, 12, 3), nil), ev(Removed(w1, 11), nil),
				ev(In(host, Stored(w1, 10, 11, 2)), nil)},
			query: []uint64{1, 2, 3},
			want:  TierScores{w1: {1, 3, 3, 3}},
		},
		{
			name:  "a parent held on disk only",
			steps: []step{ev(In(disk, Stored(w1, -1, 20, 1)), nil), ev(Stored(w1, 20, 21, 2), nil)},
			query: []uint64{1, 2},
			want:  TierScores{w1: {0, 0, 2, 2}},
		},
		{
			name:  "removing a tier the block is not in",
			steps: []step{ev(Stored(w1, -1, 10, 1), nil), ev(In(host, Removed(w1, 10)), radix.ErrBlockNotFound)},
			query: []uint64{1},
			want:  TierScores{w1: {1, 1, 1, 1}},
		},
		{
			name: "cleared per tier",
			steps: []step{ev(Stored(w1, -1, 10, 1, 11, 2), nil), ev(In(host, Stored(w1, -1, 10, 1, 11, 2, 12, 3)), nil),
				ev(In(ext, Stored(w2, -1, 30, 1)), nil), ev(Cleared(w1), nil)},
			query: []uint64{1, 2, 3},
			want:  TierScores{w1: {0, 3, 3, 3}, w2: {0, 0, 0, 1}},
		},
		{
			name: "every tier cleared leaves nothing",
			steps: []step{ev(Stored(w1, -1, 10, 1), nil), ev(In(disk, Stored(w1, -1, 10, 1)), nil),
				ev(In(disk, Cleared(w1)), nil), ev(Cleared(w1), nil)},
			query: []uint64{1},
			want:  TierScores{},
		},
		{
			name:  "a hash stored under another path moves there, in its new tier only",
			steps: []step{ev(Stored(w1, -1, 10, 1), nil), ev(In(host, Stored(w1, -1, 10, 2)), nil)},
			query: []uint64{2},
			want:  TierScores{w1: {0, 1, 1, 1}},
		},
		{
			name: "workers and ranks apart",
			steps: []step{ev(Stored(w1, -1, 10, 1, 11, 2), nil), ev(In(host, Stored(w1r, -1, 10, 1, 11, 2)), nil),
				ev(In(disk, Stored(w2, -1, 10, 1)), nil)},
			query: []uint64{1, 2},
			want:  TierScores{w1: {2, 2, 2, 2}, w1r: {0, 2, 2, 2}, w2: {0, 0, 1, 1}},
		},
		{
			name:   "a shared host tier credits its members, stored once",
			groups: map[kvevent.Worker][]kvevent.Worker{pool: {w1, w2}},
			steps: []step{ev(In(host, Stored(pool, -1, 10, 1, 11, 2, 12, 3)), nil), ev(Stored(w1, -1, 20, 1), nil),
				ev(In(disk, Stored(w1r, -1, 30, 1)), nil)},
			query: []uint64{1, 2, 3},
			want:  TierScores{w1: {1, 3, 3, 3}, w2: {0, 3, 3, 3}, w1r: {0, 0, 1, 1}},
		},
		{
			name:   "a member's own blocks and its group's interleave",
			groups: map[kvevent.Worker][]kvevent.Worker{pool: {w1}},
			steps: []step{ev(Stored(w1, -1, 10, 1, 11, 2, 12, 3), nil), ev(Removed(w1, 11), nil),
				ev(In(ext, Stored(pool, -1, 20, 1, 21, 2)), nil)},
			query: []uint64{1, 2, 3},
			want:  TierScores{w1: {1, 1, 1, 3}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			idx := newIndex()
			model := NewModel()
			for holder, members := range tc.groups {
				idx.SetGroup(holder, members)
				model.SetGroup(holder, members)
			}
			for i, s := range tc.steps {
				err := idx.Apply(*s.ev)
				if (s.wantErr == nil) != (err == nil) || (s.wantErr != nil && !errors.Is(err, s.wantErr)) {
					t.Fatalf("step %d: error %v, want %v", i, err, s.wantErr)
				}
				_ = model.Apply(*s.ev)
			}
			if got := idx.FindTierMatches(tc.query); !maps.Equal(got.Scores, tc.want) {
				t.Errorf("tier scores %v, want %v", got.Scores, tc.want)
			}
			Check(t, idx, model, tc.query)
		})
	}
	t.Run("model", func(t *testing.T) {
		for seed := range uint64(20) {
			g := &Gen{Src: rand.New(rand.NewPCG(seed, 11)), Model: NewModel(), Tiers: true}
			idx := newIndex()
			if seed%2 == 1 { // worker 2 rank 0 is the shared store of 0 and 1
				holder, members := kvevent.Worker{ID: 2}, []kvevent.Worker{{ID: 0}, {ID: 1}, {ID: 1, DPRank: 1}}
				idx.SetGroup(holder, members)
				g.Model.SetGroup(holder, members)
			}
			for i := range 300 {
				if !Step(t, idx, g) {
					t.Fatalf("seed %d step %d failed", seed, i)
				}
			}
		}
	})
}

// checkTiers compares an index's tier scores with the model's, if it
// keeps tiers.
func checkTiers(t testing.TB, idx radix.Index, model *Model, query []uint64) {
	t.Helper()
	ti, ok := idx.(radix.TierIndex)
	if !ok {
		return
	}
	got := ti.FindTierMatches(query)
	want := model.TierScores(query)
	if !maps.Equal(got.Scores, want) {
		t.Fatalf("query %v: tier scores %v, model says %v", query, got.Scores, want)
	}
	checkTreeSizes(t, query, got.TreeSizes, maps.Keys(want), model.TierTreeSize)
}
