// Package radixtest holds what every radix.Index is tested with: a naive
// model of the semantics, a random event-stream generator, and the
// conformance suite (Run).
package radixtest

import (
	"cmp"
	"encoding/binary"
	"fmt"
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

// Holdings is what an index holds, compactly: per worker, each engine hash
// and a 64-bit chained hash of the path it names. Model keeps whole paths
// (the right referee for small streams, quadratic in memory on deep
// chains); Holdings compares large indexes in memory linear in their
// pairs, at the cost of a 2^-64 chance per pair of missing a difference.
type Holdings map[kvevent.Worker]map[uint64]uint64

// HoldingsOf rebuilds an index's Holdings from its Dump, streamed
// (radix.DumpEach).
func HoldingsOf(idx radix.Index) (Holdings, error) {
	h := Holdings{}
	var err error
	radix.DumpEach(idx, func(ev kvevent.RouterEvent) {
		if e := h.Apply(ev); e != nil && err == nil {
			err = fmt.Errorf("dump event %d: %w", ev.Event.ID, e)
		}
	})
	return h, err
}

// Apply applies an event with the semantics of package radix (engine-hash
// aliases included; a rejected event changes nothing), so that Holdings can
// be built straight from an event stream.
func (h Holdings) Apply(ev kvevent.RouterEvent) error {
	w := ev.Worker()
	names := h[w]
	switch d := ev.Event.Data.(type) {
	case kvevent.Stored:
		var path uint64
		if d.HasParent {
			p, ok := names[d.ParentHash]
			if !ok {
				return radix.ErrParentNotFound
			}
			path = p
		}
		parent, has := d.ParentHash, d.HasParent
		for _, b := range d.Blocks {
			if has && b.BlockHash == parent {
				return radix.ErrInvalidSequence
			}
			parent, has = b.BlockHash, true
		}
		if names == nil {
			names = map[uint64]uint64{}
			h[w] = names
		}
		for _, b := range d.Blocks {
			path = chain(path, b.TokensHash)
			names[b.BlockHash] = path
		}
	case kvevent.Removed:
		for _, bh := range d.BlockHashes {
			delete(names, bh)
		}
		if len(names) == 0 {
			delete(h, w)
		}
	case kvevent.Cleared:
		delete(h, w)
	default:
		return radix.ErrInvalidEvent
	}
	return nil
}

// chain mixes a path hash and a tokens hash (murmur3's finaliser).
func chain(path, local uint64) uint64 {
	x := path*0x9E3779B97F4A7C15 ^ local ^ 0x5851F42D4C957F2D
	x ^= x >> 33
	x *= 0xFF51AFD7ED558CCD
	x ^= x >> 33
	x *= 0xC4CEB9FE1A85EC53
	return x ^ x>>33
}

// Diff describes how two Holdings differ, or returns "" when equal.
func (h Holdings) Diff(o Holdings) string {
	for _, pair := range [2][2]Holdings{{h, o}, {o, h}} {
		a, b := pair[0], pair[1]
		for w, names := range a {
			if !maps.Equal(names, b[w]) {
				return fmt.Sprintf("worker %v holds %d engine hashes in one and %d in the other (or different paths)", w, len(names), len(b[w]))
			}
		}
	}
	return ""
}

// DiffIndex compares h, the expected holdings, with what idx holds, by
// streaming idx's dump against h: it keeps only what differs (and the
// dump's placeholders, until their removal), not a second copy of h.
func (h Holdings) DiffIndex(idx radix.Index) string {
	matched := map[kvevent.Worker]int{}
	side := Holdings{} // dump names whose path is not h's: placeholders, or differences
	path := func(w kvevent.Worker, name uint64) (uint64, bool) {
		if p, ok := side[w][name]; ok {
			return p, true
		}
		p, ok := h[w][name]
		return p, ok
	}
	var bad string
	radix.DumpEach(idx, func(ev kvevent.RouterEvent) {
		w := ev.Worker()
		switch d := ev.Event.Data.(type) {
		case kvevent.Stored:
			var p uint64
			if d.HasParent {
				var ok bool
				if p, ok = path(w, d.ParentHash); !ok && bad == "" {
					bad = fmt.Sprintf("dump event %d of worker %v: parent %#x unknown", ev.Event.ID, w, d.ParentHash)
				}
			}
			for _, b := range d.Blocks {
				p = chain(p, b.TokensHash)
				if want, ok := h[w][b.BlockHash]; ok && want == p {
					matched[w]++
					continue
				}
				if side[w] == nil {
					side[w] = map[uint64]uint64{}
				}
				side[w][b.BlockHash] = p
			}
		case kvevent.Removed:
			for _, bh := range d.BlockHashes {
				delete(side[w], bh)
			}
		}
	})
	if bad != "" {
		return bad
	}
	for w, names := range side {
		if len(names) > 0 {
			return fmt.Sprintf("worker %v holds %d engine hashes not expected (or on other paths)", w, len(names))
		}
	}
	for w, names := range h {
		if matched[w] != len(names) {
			return fmt.Sprintf("worker %v holds %d of the %d engine hashes expected", w, matched[w], len(names))
		}
	}
	return ""
}
