package radix

import "github.com/kvradix/kvradix/kvevent"

// Dump implements Index.
func (t *CompressedTree) Dump() []kvevent.RouterEvent { return collect(t.dumpEach) }

// dumpEach yields what Dump returns (see DumpEach).
func (t *CompressedTree) dumpEach(yield func(kvevent.RouterEvent)) {
	t.ready()
	for i := range t.stripes {
		t.stripes[i].mu.Lock()
		defer t.stripes[i].mu.Unlock()
	}
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
					if _, ok := xw.eng.get(h); ok {
						return true
					}
				}
			}
			return false
		},
	}
	dumpByDepth(d, func(add func(w kvevent.Worker, h, n uint64)) {
		t.workers.Range(func(w kvevent.Worker, xw *xworker) bool {
			xw.eng.each(func(h, loc uint64) { add(w, h, loc) })
			return true
		})
	}, func(loc uint64) uint32 {
		r, off := t.unpack(loc)
		return startOf(r) + off
	})
}
