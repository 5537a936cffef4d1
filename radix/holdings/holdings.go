// Package holdings is the reference of what an index holds, compactly:
// per worker, each engine hash and a hash of the path it names, built
// straight from an event stream with the semantics of package radix, and
// compared with an index by streaming its dump. It is not test code: the
// load generator and the service check indexes against it, and no binary
// links package testing.
package holdings

import (
	"fmt"
	"maps"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// Set is what an index holds, compactly: per worker, each engine hash
// and a 64-bit chained hash of the path it names. Model keeps whole paths
// (the right referee for small streams, quadratic in memory on deep
// chains); a Set compares large indexes in memory linear in their
// pairs, at the cost of a 2^-64 chance per pair of missing a difference.
type Set map[kvevent.Worker]map[uint64]uint64

// Of rebuilds an index's Set from its Dump, streamed (radix.DumpEach).
func Of(idx radix.Index) (Set, error) {
	h := Set{}
	var err error
	radix.DumpEach(idx, func(ev kvevent.RouterEvent) {
		if e := h.Apply(ev); e != nil && err == nil {
			err = fmt.Errorf("dump event %d: %w", ev.Event.ID, e)
		}
	})
	return h, err
}

// Apply applies an event with the semantics of package radix (engine-hash
// aliases included; a rejected event changes nothing), so that a Set can
// be built straight from an event stream.
func (h Set) Apply(ev kvevent.RouterEvent) error {
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

// Diff describes how two Sets differ, or returns "" when equal.
func (h Set) Diff(o Set) string {
	for _, pair := range [2][2]Set{{h, o}, {o, h}} {
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
func (h Set) DiffIndex(idx radix.Index) string {
	matched := map[kvevent.Worker]int{}
	side := Set{} // dump names whose path is not h's: placeholders, or differences
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
