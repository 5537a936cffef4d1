// Package radixtest holds what every radix.Index is tested with: a naive
// model of the semantics, a random event-stream generator, and the
// conformance suite (Run).
package radixtest

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"github.com/kvradix/kvradix/radix/holdings"
	"maps"
	"slices"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// Model is the deliberately naive statement of radix.Index semantics: per
// worker, the engine hashes it used, the prefix path each names (a path is
// the string of its local hashes) and the tiers it holds it in; the worker
// holds every path some hash names, in the tiers of those hashes. It has
// no tree at all. Streams of the device tier alone are every index's
// semantics; other tiers are radix.TierIndex's.
type Model struct {
	workers map[kvevent.Worker]*modelWorker
	groups  map[kvevent.Worker][]kvevent.Worker // shared-tier holder -> members
}

// SetGroup declares holder as serving members (radix.TierIndex.SetGroup);
// no members undeclares it.
func (m *Model) SetGroup(holder kvevent.Worker, members []kvevent.Worker) {
	if m.groups == nil {
		m.groups = map[kvevent.Worker][]kvevent.Worker{}
	}
	if len(members) == 0 {
		delete(m.groups, holder)
		return
	}
	m.groups[holder] = slices.Clone(members)
}

type modelWorker struct {
	byHash map[uint64]string          // engine hash -> path
	tiers  map[uint64]kvevent.TierSet // engine hash -> the tiers it is held in
}

// byPath returns every path w holds with its engine hashes, sorted.
func (mw *modelWorker) byPath() map[string][]uint64 {
	out := map[string][]uint64{}
	for h, p := range mw.byHash {
		out[p] = append(out[p], h)
	}
	for _, hs := range out {
		slices.Sort(hs)
	}
	return out
}

// holds reports whether some engine hash names path in a tier of in.
func (mw *modelWorker) holds(path string, in func(kvevent.TierSet) bool) bool {
	for h, p := range mw.byHash {
		if p == path && in(mw.tiers[h]) {
			return true
		}
	}
	return false
}

// drop takes tier away from h.
func (mw *modelWorker) drop(h uint64, tier kvevent.Tier) {
	if mw.tiers[h] &^= tier.Set(); mw.tiers[h] == 0 {
		delete(mw.byHash, h)
		delete(mw.tiers, h)
	}
}

// NewModel returns an empty model.
func NewModel() *Model { return &Model{workers: map[kvevent.Worker]*modelWorker{}} }

func extend(path string, local uint64) string {
	return string(binary.LittleEndian.AppendUint64([]byte(path), local))
}

// PathOf returns the model's path of the given local hashes.
func PathOf(local []uint64) string {
	p := ""
	for _, h := range local {
		p = extend(p, h)
	}
	return p
}

// Apply applies an event with the semantics documented in package radix.
func (m *Model) Apply(ev kvevent.RouterEvent) error {
	if err := ev.Check(); err != nil {
		return fmt.Errorf("%w: %v (model)", radix.ErrInvalidEvent, err)
	}
	w := ev.Worker()
	mw := m.workers[w]
	if mw == nil {
		mw = &modelWorker{byHash: map[uint64]string{}, tiers: map[uint64]kvevent.TierSet{}}
	}
	switch d := ev.Event.Data.(type) {
	case kvevent.Stored:
		parentHash, hasParent := d.ParentHash, d.HasParent
		for _, b := range d.Blocks {
			if hasParent && b.BlockHash == parentHash {
				return fmt.Errorf("%w: model", radix.ErrInvalidSequence)
			}
			parentHash, hasParent = b.BlockHash, true
		}
		path := ""
		if d.HasParent {
			p, ok := mw.byHash[d.ParentHash]
			if !ok {
				return fmt.Errorf("%w: model", radix.ErrParentNotFound)
			}
			path = p
		}
		m.workers[w] = mw
		for _, b := range d.Blocks {
			path = extend(path, b.TokensHash)
			if mw.byHash[b.BlockHash] == path {
				mw.tiers[b.BlockHash] |= ev.Tier.Set() // held here in one more tier
				continue
			}
			mw.byHash[b.BlockHash] = path // a new alias, or renamed: in this tier only
			mw.tiers[b.BlockHash] = ev.Tier.Set()
		}
	case kvevent.Removed:
		missing := 0
		for _, h := range d.BlockHashes {
			if !mw.tiers[h].Has(ev.Tier) {
				missing++
				continue
			}
			mw.drop(h, ev.Tier)
		}
		if missing > 0 {
			return fmt.Errorf("%w: %d (model)", radix.ErrBlockNotFound, missing)
		}
	case kvevent.Cleared:
		for h := range mw.byHash {
			if mw.tiers[h].Has(ev.Tier) {
				mw.drop(h, ev.Tier)
			}
		}
		if len(mw.byHash) == 0 {
			delete(m.workers, w)
		}
	default:
		return radix.ErrInvalidEvent
	}
	return nil
}

// RemoveWorker drops every rank of id.
func (m *Model) RemoveWorker(id kvevent.WorkerID) {
	for w := range m.workers {
		if w.ID == id {
			delete(m.workers, w)
		}
	}
}

// Scores returns, for each worker holding at least block 0 of local on
// the device, how many consecutive blocks from block 0 it holds there.
func (m *Model) Scores(local []uint64) map[kvevent.Worker]uint32 {
	out := map[kvevent.Worker]uint32{}
	for w, mw := range m.workers {
		if n := mw.prefix(local, func(s kvevent.TierSet) bool { return s.Has(kvevent.TierDevice) }); n > 0 {
			out[w] = n
		}
	}
	return out
}

// TierScores returns, for each worker holding at least block 0 of local
// in some tier, per tier t the consecutive blocks from block 0 it holds in
// t or a nearer tier (radix.TierScores).
//
// A group holder (SetGroup) is not scored; each of its members is, holding
// what it holds and what its holders hold.
func (m *Model) TierScores(local []uint64) map[kvevent.Worker][kvevent.NumTiers]uint32 {
	candidates := map[kvevent.Worker]bool{}
	for w := range m.workers {
		candidates[w] = true
	}
	for _, members := range m.groups {
		for _, w := range members {
			candidates[w] = true
		}
	}
	out := map[kvevent.Worker][kvevent.NumTiers]uint32{}
	for w := range candidates {
		if _, holder := m.groups[w]; holder {
			continue
		}
		holders := []*modelWorker{m.workers[w]}
		for g, members := range m.groups {
			if slices.Contains(members, w) {
				holders = append(holders, m.workers[g])
			}
		}
		var sc [kvevent.NumTiers]uint32
		for _, t := range kvevent.Tiers {
			in := func(s kvevent.TierSet) bool { return s.UpTo(t) }
			path := ""
			for _, h := range local {
				path = extend(path, h)
				if !slices.ContainsFunc(holders, func(mw *modelWorker) bool { return mw != nil && mw.holds(path, in) }) {
					break
				}
				sc[t]++
			}
		}
		if sc[kvevent.TierExternal] > 0 {
			out[w] = sc
		}
	}
	return out
}

// prefix counts the leading blocks of local mw holds in a tier of in.
func (mw *modelWorker) prefix(local []uint64, in func(kvevent.TierSet) bool) uint32 {
	path, n := "", uint32(0)
	for _, h := range local {
		path = extend(path, h)
		if !mw.holds(path, in) {
			break
		}
		n++
	}
	return n
}

// Tiers returns the tiers in which w holds engine hash h.
func (m *Model) Tiers(w kvevent.Worker, h uint64) kvevent.TierSet {
	if mw := m.workers[w]; mw != nil {
		return mw.tiers[h]
	}
	return 0
}

// Size returns the number of (worker, path, tier) memberships.
func (m *Model) Size() int {
	n := 0
	for w := range m.workers {
		n += m.TierTreeSize(w)
	}
	return n
}

// TreeSize returns how many blocks w holds on the device.
func (m *Model) TreeSize(w kvevent.Worker) int { return m.pathsIn(w, kvevent.TierDevice) }

// TierTreeSize returns how many blocks w holds, summed over the tiers.
func (m *Model) TierTreeSize(w kvevent.Worker) int {
	n := 0
	for _, t := range kvevent.Tiers {
		n += m.pathsIn(w, t)
	}
	return n
}

// pathsIn counts the paths w holds in tier t.
func (m *Model) pathsIn(w kvevent.Worker, t kvevent.Tier) int {
	mw := m.workers[w]
	if mw == nil {
		return 0
	}
	paths := map[string]bool{}
	for h, p := range mw.byHash {
		if mw.tiers[h].Has(t) {
			paths[p] = true
		}
	}
	return len(paths)
}

// Hashes returns the engine hashes w holds, sorted.
func (m *Model) Hashes(w kvevent.Worker) []uint64 {
	if mw := m.workers[w]; mw != nil {
		return slices.Sorted(maps.Keys(mw.byHash))
	}
	return nil
}

// Paths returns every path w holds with its engine hashes (sorted).
func (m *Model) Paths(w kvevent.Worker) map[string][]uint64 {
	if mw := m.workers[w]; mw != nil {
		return mw.byPath()
	}
	return nil
}

// Workers returns the workers holding at least one block.
func (m *Model) Workers() []kvevent.Worker {
	var ws []kvevent.Worker
	for w, mw := range m.workers {
		if len(mw.byHash) > 0 {
			ws = append(ws, w)
		}
	}
	slices.SortFunc(ws, func(a, b kvevent.Worker) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.DPRank, b.DPRank))
	})
	return ws
}

// Diff describes how two models differ in what each worker holds (paths and
// their engine hashes), or returns "" when they hold the same.
func (m *Model) Diff(o *Model) string {
	ws := map[kvevent.Worker]bool{}
	for _, w := range m.Workers() {
		ws[w] = true
	}
	for _, w := range o.Workers() {
		ws[w] = true
	}
	for w := range ws {
		a, b := m.Paths(w), o.Paths(w)
		if !maps.EqualFunc(a, b, slices.Equal) {
			return fmt.Sprintf("worker %v holds %d paths in one and %d in the other (or different hashes)", w, len(a), len(b))
		}
		for _, h := range m.Hashes(w) {
			if x, y := m.Tiers(w, h), o.Tiers(w, h); x != y {
				return fmt.Sprintf("worker %v holds hash %#x in tiers %04b in one and %04b in the other", w, h, x, y)
			}
		}
	}
	return ""
}

// FromDump rebuilds a model from an index's Dump, so an index's whole state
// can be compared with a model. It fails if the dump does not apply cleanly.
func FromDump(idx radix.Index) (*Model, error) {
	m := NewModel()
	for i, ev := range idx.Dump() {
		if err := m.Apply(ev); err != nil {
			return nil, fmt.Errorf("dump event %d (%v): %w", i, ev.Event.Data.Kind(), err)
		}
	}
	return m, nil
}

// Holdings is holdings.Set, under its older name for tests.
type Holdings = holdings.Set

// HoldingsOf is holdings.Of.
func HoldingsOf(idx radix.Index) (Holdings, error) { return holdings.Of(idx) }
