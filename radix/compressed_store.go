package radix

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/kvradix/kvradix/kvevent"
)

// storeScratch holds a store's per-block buffers, reused across events.
type storeScratch struct {
	locs  []uint64 // each block's location
	fresh []bool   // whether the walk made the worker hold the block
	old   []uint64 // blocks whose engine hash the event re-pointed
}

// store applies a Stored event in three passes:
//
//  1. walk: find or create each block's place along the path, run by run
//     under the runs' locks, and make the worker hold it (one holder update
//     per run, not per block);
//  2. name: insert the engine hashes into the worker's table, under no
//     lock: a hash new to the worker whose block it did not hold before
//     adds a block, one whose block it already held adds an alias, one
//     re-pointed from another block leaves that block (pass 3);
//  3. leave the re-pointed blocks, last, so that the path just stored is
//     never trimmed.
func (t *CompressedTree) store(w kvevent.Worker, d kvevent.Stored) error {
	if err := checkChain(w, d); err != nil {
		return err
	}
	xw, _ := t.workers.Load(w)
	others := t.otherTiers(w)
	var parent uint64 // the root
	if d.HasParent {
		ok := false
		if xw != nil {
			parent, ok = xw.eng.get(d.ParentHash)
		}
		// A block stored in one tier may hang under one held in another:
		// the worker's other holders are written by this goroutine too, so
		// the parent stays held while the store runs.
		for _, o := range others {
			if !ok && o != nil {
				parent, ok = o.eng.get(d.ParentHash)
			}
		}
		if !ok {
			rw, _ := tierHolderOf(w)
			return fmt.Errorf("%w: worker %v, parent %#x", ErrParentNotFound, rw, d.ParentHash)
		}
	}
	if len(d.Blocks) == 0 {
		return nil
	}
	if xw == nil {
		xw = t.worker(w)
	}
	s := t.stores.Get().(*storeScratch)
	n := len(d.Blocks)
	s.locs, s.fresh, s.old = slices.Grow(s.locs[:0], n)[:n], slices.Grow(s.fresh[:0], n)[:n], s.old[:0]
	t.walk(xw, parent, d.Blocks, s)
	joined := t.name(xw, d.Blocks, s)
	l := leaver{t: t, xw: xw}
	for _, loc := range s.old {
		l.unname(loc)
	}
	l.release()
	t.addSize(xw, joined-l.left) // once per event, not per block
	t.moved(others, d.Blocks, s.locs)
	t.stores.Put(s)
	return nil
}

// moved makes the other tiers' holders leave the event's engine hashes
// that name other blocks there: a hash stored under another path names a
// new block, in the new tier only (as Tree). It runs after the store, so
// the path stored is held and never trimmed.
func (t *CompressedTree) moved(others [kvevent.NumTiers - 1]*xworker, blocks []kvevent.StoredBlock, locs []uint64) {
	for _, o := range others {
		if o == nil {
			continue
		}
		var gone []uint64
		for i, b := range blocks {
			if loc, ok := o.eng.get(b.BlockHash); ok && loc != locs[i] {
				gone = append(gone, b.BlockHash)
			}
		}
		if len(gone) > 0 {
			_ = t.remove(o.worker, gone) // all held: no error
		}
	}
}

// name enters the event's engine hashes in the worker's table (pass 2 of
// store) and returns how many blocks the worker holds that it did not.
func (t *CompressedTree) name(xw *xworker, blocks []kvevent.StoredBlock, s *storeScratch) int {
	joined := 0
	xw.eng.warm(blocks[:min(warmAhead, len(blocks))])
	for i, b := range blocks {
		if i%warmAhead == 0 && i+warmAhead < len(blocks) {
			xw.eng.warm(blocks[i+warmAhead : min(i+2*warmAhead, len(blocks))])
		}
		loc := s.locs[i]
		e, had := xw.eng.slot(b.BlockHash)
		old := e.loc
		if had && old == loc {
			continue // already named so: the walk found it held
		}
		e.loc = loc
		if s.fresh[i] {
			joined++
		} else {
			if xw.aliases == nil {
				xw.aliases = map[uint64]uint32{}
			}
			xw.aliases[loc]++
		}
		if had {
			s.old = append(s.old, old)
		}
	}
	return joined
}

// warmAhead is how many blocks' engine-table slots a store loads ahead.
const warmAhead = 16

// walker is the state of a store's walk (pass 1): the run it is in,
// locked, with its writer-side keys and length (published when the walk
// leaves the run), and the event's blocks placed in it so far.
type walker struct {
	t      *CompressedTree
	xw     *xworker
	s      *storeScratch
	r      *crun
	ks     []uint64
	n, off uint32 // the run's length; the position last reached
	from   uint32 // the position of the first block placed in r
	first  int    // that block's index in the event
}

// walk places every block (pass 1 of store): s.locs and s.fresh.
func (t *CompressedTree) walk(xw *xworker, parent uint64, blocks []kvevent.StoredBlock, s *storeScratch) {
	wk := walker{t: t, xw: xw, s: s}
	i := 0
	if parent != 0 {
		r, off := t.unpack(parent) // held by xw, so live
		r.mu.Lock()
		wk.enter(r, off+1, 0)
		wk.off = off
	} else {
		key := blocks[0].TokensHash
		root := t.rootLock(key)
		root.Lock()
		r := t.child(nil, 0, key)
		if r == nil {
			r = t.newRun(nil, 0, key, len(blocks))
		}
		r.mu.Lock()
		root.Unlock()
		wk.enter(r, 0, 0)
		s.locs[0] = pack(r, 0)
		i = 1
	}
	for ; i < len(blocks); i++ {
		wk.step(i, blocks[i].TokensHash, len(blocks)-i)
	}
	wk.leave()
	wk.r.mu.Unlock()
}

// enter starts on r, locked, where block first will be at position from.
func (wk *walker) enter(r *crun, from uint32, first int) {
	wk.r, wk.ks, wk.n = r, *r.keys.Load(), r.n.Load()
	wk.off, wk.from, wk.first = from, from, first
}

// step places block i, of tokens hash key, after the last one; room is how
// many blocks the event stores from here on (this one included), so that a
// run created or extended by the event is sized once.
func (wk *walker) step(i int, key uint64, room int) {
	r, next := wk.r, wk.off+1
	if next < wk.n && wk.ks[next] == key { // the run's own next block
		wk.off = next
		wk.s.locs[i] = pack(r, next)
		return
	}
	var c *crun
	if next < wk.n || r.hasKidAt(wk.off) {
		c = wk.t.child(r, wk.off, key)
	}
	if c == nil && next == wk.n {
		// The run's end, and no child run has the block: extend the run.
		wk.push(key, room)
		wk.off = next
		wk.s.locs[i] = pack(r, next)
		return
	}
	if c == nil {
		c = wk.t.newRun(r, wk.off, key, room)
	}
	wk.leave()
	c.mu.Lock()
	r.mu.Unlock()
	wk.enter(c, 0, i)
	wk.s.locs[i] = pack(c, 0)
}

// push appends key at the run's end (unpublished until leave), growing the
// array to fit room blocks more (the rest of the event may extend the run
// too), or by an eighth, so that runs extended in small steps still append
// in amortised constant time. An array once published past this length
// (the run was trimmed) is not written again: the run gets a fresh one.
func (wk *walker) push(key uint64, room int) {
	r, n := wk.r, wk.n
	if int(n) == len(wk.ks) || n < r.hw {
		grown := make([]uint64, int(n)+max(room, int(n)/8, 1))
		copy(grown, wk.ks[:n])
		r.keys.Store(&grown)
		wk.ks, r.hw = grown, n
	}
	wk.ks[n] = key
	wk.n++
}

// leave publishes the run's length and makes the worker hold the blocks
// placed in it; the caller releases the run's lock.
func (wk *walker) leave() {
	r := wk.r
	if wk.n != r.n.Load() {
		r.n.Store(wk.n)
		r.hw = max(r.hw, wk.n)
	}
	if wk.off >= wk.from {
		r.hold(wk.xw, wk.from, wk.off, wk.s.fresh[wk.first:wk.first+int(wk.off-wk.from)+1])
	}
}

// hold makes xw hold positions from..to of r (locked), setting fresh[i]
// for each position it did not hold; its cut is written once.
func (r *crun) hold(xw *xworker, from, to uint32, fresh []bool) {
	hs := r.holderArray()
	i, found := holderOf(hs, xw)
	if !found {
		grown := make([]holder, len(hs)+1)
		copy(grown, hs[:i])
		grown[i] = holder{w: xw}
		copy(grown[i+1:], hs[i:])
		r.holders.Store(&grown) // a variable of its own: &hs would move hs to the heap on every call
		hs = grown
	}
	h := &hs[i]
	for int(to/64) >= len(h.bits) {
		h.bits = append(h.bits, 0)
	}
	for p := from; p <= to; p++ {
		word, bit := &h.bits[p/64], uint64(1)<<(p%64)
		f := *word&bit == 0
		fresh[p-from] = f
		if f {
			*word |= bit
			h.held++
		}
	}
	h.top = max(h.top, to+1)
	if cut := atomic.LoadUint32(&h.cut); cut >= from && cut <= to {
		for cut = to + 1; cut < h.top && h.has(cut); cut++ {
		}
		atomic.StoreUint32(&h.cut, cut)
	}
}

// holderOf returns the index of xw among hs.
func holderOf(hs []holder, xw *xworker) (int, bool) {
	return slices.BinarySearchFunc(hs, xw.slot, func(h holder, slot uint32) int { return int(h.w.slot) - int(slot) })
}

func (r *crun) kidAt(off uint32) (int, bool) {
	return slices.BinarySearchFunc(r.kids, off, func(k kidCount, off uint32) int { return int(k.off) - int(off) })
}

func (r *crun) hasKidAt(off uint32) bool {
	_, found := r.kidAt(off)
	return found
}

// newRun creates a one-block run hanging from position off of parent
// (locked; for the root, the key's root stripe is).
func (t *CompressedTree) newRun(parent *crun, off uint32, key uint64, room int) *crun {
	r := &crun{parent: parent, parentOff: off, first: key, serial: t.serials.Add(1)}
	ks := make([]uint64, max(room, 1))
	ks[0] = key
	r.keys.Store(&ks)
	r.n.Store(1)
	r.hw = 1
	t.runs.add(r)
	if parent != nil {
		i, found := parent.kidAt(off)
		if found {
			parent.kids[i].n++
		} else {
			parent.kids = slices.Insert(parent.kids, i, kidCount{off, 1})
		}
	}
	// Prepend to the key's chain, atomically with other changes to it (the
	// chain may hold runs of other parents): a reader sees the chain with
	// or without the new run, both well formed.
	t.heads.Compute(t.edgeKey(parent, off, key), func(head *crun, loaded bool) (*crun, xsync.ComputeOp) {
		if loaded {
			r.collide.Store(head)
		}
		return r, xsync.UpdateOp
	})
	return r
}
