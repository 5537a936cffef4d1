package radix

import (
	"maps"
	"math/bits"
	"slices"

	"github.com/kvradix/kvradix/kvevent"
)

// Dump implements Index.
func (t *CompressedTree) Dump() []kvevent.RouterEvent { return collect(t.dumpEach) }

// dumpEach yields what Dump returns (see DumpEach).
func (t *CompressedTree) dumpEach(yield func(kvevent.RouterEvent)) {
	t.ready()
	defer t.lockWriters()()
	starts := map[*crun]uint32{} // depth of each run's first block
	var startOf func(r *crun) uint32
	startOf = func(r *crun) uint32 {
		if r.parent == nil {
			return 0
		}
		if d, ok := starts[r]; ok {
			return d
		}
		d := startOf(r.parent) + r.parentOff + 1
		starts[r] = d
		return d
	}
	d := &dumper[uint64]{
		root: 0,
		// A holder's events are its worker's, in its tier.
		yield: func(ev kvevent.RouterEvent) {
			w, tier := tierHolderOf(ev.Worker())
			ev.Event.DPRank, ev.Tier = w.DPRank, tier
			yield(ev)
		},
		key: func(loc uint64) uint64 {
			r, off := t.unpack(loc)
			return r.view()[off]
		},
		parent: func(loc uint64) uint64 {
			r, off := t.unpack(loc)
			switch {
			case off > 0:
				return pack(r, off-1)
			case r.parent != nil:
				return pack(r.parent, r.parentOff)
			}
			return 0
		},
		owns: func(hw kvevent.Worker, h uint64) bool { // in any tier: placeholders must not alias
			w, _ := tierHolderOf(hw)
			for _, tier := range kvevent.Tiers {
				if xw, _ := t.workers.Load(tierHolder(w, tier)); xw != nil {
					if _, _, ok := t.nameOf(xw, h); ok {
						return true
					}
				}
			}
			return false
		},
	}
	depth := func(loc uint64) uint32 {
		r, off := t.unpack(loc)
		return startOf(r) + off
	}
	// One worker at a time (all its tiers' holders together, for parents
	// held in another tier): the dump's tables hold one worker's blocks,
	// not the whole index's. Each worker's events are parents first, its
	// placeholders' removals last; workers are independent.
	holders := map[kvevent.Worker][]*xworker{}
	t.workers.Range(func(h kvevent.Worker, xw *xworker) bool {
		w, _ := tierHolderOf(h)
		holders[w] = append(holders[w], xw)
		return true
	})
	for _, w := range slices.SortedFunc(maps.Keys(holders), compareWorkers) {
		d.held, d.extra, d.placeholders, d.removals = nil, nil, nil, nil
		dumpByDepth(d, func(add func(w kvevent.Worker, h, n uint64)) {
			for _, xw := range holders[w] {
				t.eachName(xw, func(h, loc uint64) { add(xw.worker, h, loc) })
			}
		}, depth)
	}
}

// eachName calls fn for every engine hash xw names a block by, and the
// block; no writer may run.
func (t *CompressedTree) eachName(xw *xworker, fn func(h, loc uint64)) {
	for r := range xw.runs {
		hs := r.holderArray()
		i, _ := holderOf(hs, xw)
		eng := *r.eng.Load()
		for w, word := range hs[i].bits {
			for ; word != 0; word &= word - 1 {
				off := uint32(64*w + bits.TrailingZeros64(word))
				if loc := pack(r, off); xw.count(loc)&noOwn == 0 {
					fn(eng[off], loc)
				}
			}
		}
	}
	for h, loc := range xw.xnames {
		fn(h, loc)
	}
}
