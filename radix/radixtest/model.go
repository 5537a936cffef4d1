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
// worker, the engine hashes it used and the prefix path each names (a path
// is the string of its local hashes); the worker holds every path some hash
// names. It has no tree at all.
type Model struct {
	workers map[kvevent.Worker]*modelWorker
}

type modelWorker struct {
	byHash map[uint64]string // engine hash -> path
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

// holds reports whether some engine hash names path.
func (mw *modelWorker) holds(path string) bool {
	for _, p := range mw.byHash {
		if p == path {
			return true
		}
	}
	return false
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
	w := ev.Worker()
	mw := m.workers[w]
	if mw == nil {
		mw = &modelWorker{byHash: map[uint64]string{}}
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
			mw.byHash[b.BlockHash] = path // a new alias, or renamed
		}
	case kvevent.Removed:
		missing := 0
		for _, h := range d.BlockHashes {
			if _, ok := mw.byHash[h]; !ok {
				missing++
				continue
			}
			delete(mw.byHash, h)
		}
		if missing > 0 {
			return fmt.Errorf("%w: %d (model)", radix.ErrBlockNotFound, missing)
		}
	case kvevent.Cleared:
		delete(m.workers, w)
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

// Scores returns, for each worker holding at least block 0 of local, how
// many consecutive blocks from block 0 it holds.
func (m *Model) Scores(local []uint64) map[kvevent.Worker]uint32 {
	out := map[kvevent.Worker]uint32{}
	for w, mw := range m.workers {
		path, n := "", uint32(0)
		for _, h := range local {
			path = extend(path, h)
			if !mw.holds(path) {
				break
			}
			n++
		}
		if n > 0 {
			out[w] = n
		}
	}
	return out
}

// Size returns the number of (worker, path) pairs held.
func (m *Model) Size() int {
	n := 0
	for _, mw := range m.workers {
		n += len(mw.byPath())
	}
	return n
}

// TreeSize returns how many blocks w holds.
func (m *Model) TreeSize(w kvevent.Worker) int {
	if mw := m.workers[w]; mw != nil {
		return len(mw.byPath())
	}
	return 0
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
	}
	return ""
}

// FromDump rebuilds a model from an index's Dump, so an index's whole state
// can be compared with a model. It fails if the dump does not apply cleanly.
func FromDump(idx radix.Index) (*Model, error) {
	m := NewModel()
	for i, ev := range idx.Dump() {
		if !ev.Tier.IsGPU() {
			return nil, fmt.Errorf("dump event %d has tier %v", i, ev.Tier)
		}
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
