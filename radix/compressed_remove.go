package radix

import (
	"math/bits"
	"slices"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/kvradix/kvradix/kvevent"
)

func (t *CompressedTree) remove(w kvevent.Worker, hashes []uint64) error {
	st := t.stripe(w.ID)
	xw := t.holder(st, w)
	if xw == nil {
		if len(hashes) == 0 {
			return nil
		}
		return &MissingBlocksError{Worker: w, Missing: len(hashes), Of: len(hashes)}
	}
	missing := 0
	l := leaver{t: t, xw: xw}
	if len(hashes) > 0 {
		l.resume(st.left, hashes[0])
	}
	peeked := 1 // hashes[:peeked] were prefetched, or are not to be
	for i := 0; i < len(hashes); i++ {
		if k := l.followRun(hashes[i:]); k > 0 {
			i += k - 1
			continue
		}
		h := hashes[i]
		loc, ok := l.follows(h)
		own := true
		if !ok {
			if i >= peeked {
				// The lookups were four fifths of a shuffled removal, one
				// cache miss after another: overlap the next few. Not from
				// the first hash: an engine evicting a sequence from its
				// tail names blocks that follow it (see follows), and one
				// lookup finds them all (ApplyBatch asks for the first
				// hash's line ahead of the event).
				peeked = min(i+peekAhead, len(hashes))
				if peeked-i > 1 {
					t.chain.prefetch(hashes[i:peeked])
				}
			}
			if loc, own, ok = t.nameOf(xw, h); !ok {
				missing++
				continue
			}
			if !own {
				delete(xw.xnames, h)
			}
		}
		l.unname(loc, own)
	}
	st.left = leftAt{xw: xw, r: l.r, last: l.last}
	l.release()
	t.addSize(xw, -l.left)
	if xw.size.Load() == 0 {
		t.forget(xw)
	}
	if missing > 0 {
		return &MissingBlocksError{Worker: w, Missing: missing, Of: len(hashes)}
	}
	return nil
}

// forget drops everything xw holds and releases its slot (its stripe
// held).
func (t *CompressedTree) forget(xw *xworker) {
	left := 0
	for r := range xw.runs {
		r.mu.Lock()
		left += r.dropHolder(xw)
		t.settle(r, xw)
	}
	t.addSize(xw, -left)
	xw.runs, xw.xnames, xw.xcount, xw.tips = nil, nil, nil, nil
	t.workers.Delete(xw.worker)
	st := t.stripe(xw.worker.ID)
	if st.last == xw {
		st.last = nil
	}
	if st.left.xw == xw {
		st.left = leftAt{} // and its run
	}
	t.slotMu.Lock()
	t.freeSlot = append(t.freeSlot, xw.slot)
	t.slotMu.Unlock()
}

// dropHolder removes xw from the holders of r (locked), returning how many
// blocks it held there.
func (r *crun) dropHolder(xw *xworker) int {
	hs := r.holderArray()
	i, found := holderOf(hs, xw)
	if !found {
		return 0
	}
	held := int(hs[i].held)
	r.dropHolderAt(hs, i)
	return held
}

// dropHolderAt publishes r's holders hs without the one at i (none, if it
// was the last: no copy then).
func (r *crun) dropHolderAt(hs []holder, i int) {
	if len(hs) == 1 {
		r.holders.Store(nil)
		return
	}
	rest := slices.Delete(slices.Clone(hs), i, i+1)
	r.holders.Store(&rest)
}

// leaver drops engine hashes of one worker from the blocks they name,
// keeping the run of the last one locked while the next is in the same
// run: tail-first eviction, a run's blocks one after another, takes its
// lock once, and settles it once.
type leaver struct {
	t    *CompressedTree
	xw   *xworker
	r    *crun  // locked, or nil
	last uint32 // the position in r the worker left last
	left int    // blocks the worker left
}

// leftAt is where a removal left its worker xw: last, the position it left
// last in run r (nil: none in hand when it ended).
type leftAt struct {
	xw   *xworker
	r    *crun
	last uint32
}

// resume takes up, for the event's first hash h, where the stripe's last
// removal left the same worker, if h may be the block before (the engine
// hash there, read as the table's lookups read it): the run locked, as
// follows needs it, which then checks all that nameOf would. An engine
// evicting a sequence from its tail in events of one hash each (vLLM)
// then finds each block in the run, not by a lookup in the table, a
// random line an event. Anything the worker or others did meanwhile is
// what follows checks, under the lock; a run deleted meanwhile is dead.
func (l *leaver) resume(at leftAt, h uint64) {
	r := at.r
	if at.xw != l.xw || r == nil || at.last == 0 {
		return
	}
	p := at.last - 1
	if eng := r.eng.Load(); eng == nil || p >= r.n.Load() || int(p) >= len(*eng) || (*eng)[p] != h {
		return
	}
	r.mu.Lock()
	if r.dead {
		r.mu.Unlock()
		return
	}
	l.r, l.last = r, at.last
}

// follows returns the block before the one the worker left last, in the
// run in hand, if h is its own hash and the worker names it so: what
// nameOf would return, with the table's answer for h read from the run (a
// block that claimed its own hash is the table's entry for it), and
// nameOf's checks after. Tail-first eviction, nearly every hash of an
// engine's removal, is then a read of the run instead of a lookup in the
// table, a random cache line a hash. False where it cannot tell.
func (l *leaver) follows(h uint64) (uint64, bool) {
	r := l.r
	if r == nil || l.last == 0 {
		return 0, false
	}
	p := l.last - 1
	if !hasBit(r.claimed, p) || (*r.eng.Load())[p] != h {
		return 0, false // the table has another block for h, or none
	}
	if _, aliased := l.xw.xname(h); aliased {
		return 0, false // the worker's name of its own for another block
	}
	loc := pack(r, p)
	return loc, l.xw.holdsOwnAt(loc, r, p)
}

// followRun leaves, for a plain worker, the blocks before the one it left
// last in the run in hand that hs name in turn by their own hashes, as
// follows and unname would one hash at a time: it checks each block as
// follows does, then leaves them together, their holder entry found once
// and updated once. Tail-first eviction, nearly every hash of an engine's
// removal, is then a compare a block. It returns how many it left (0 where
// follows must decide, or where the first hash does not follow).
func (l *leaver) followRun(hs []uint64) int {
	r, xw := l.r, l.xw
	if r == nil || l.last == 0 || !xw.plain() {
		return 0
	}
	holders := r.holderArray()
	i, found := holderOf(holders, xw)
	if !found {
		return 0
	}
	// A block the worker holds is the table's entry for its own hash
	// (follows checks it), as every block a plain worker holds is.
	h, eng := &holders[i], *r.eng.Load()
	k := 0
	for p := l.last; k < len(hs) && p > 0; k++ {
		p--
		if eng[p] != hs[k] || !h.has(p) {
			break
		}
	}
	if k > 0 {
		from := l.last - uint32(k)
		r.leaveAt(xw, holders, i, from, l.last)
		l.last, l.left = from, l.left+k
	}
	return k
}

// unname drops one name of the worker for the block at loc: its own hash
// (own), or one of its xnames (the caller deletes the entry). The worker
// leaves the block with its last name.
func (l *leaver) unname(loc uint64, own bool) {
	xw := l.xw
	c := xw.count(loc)
	if !own {
		c--
	}
	switch {
	case c&^noOwn > 0 && own:
		xw.xcount[loc] = c | noOwn // still named by names of its own
		return
	case c&^noOwn > 0:
		xw.xcount[loc] = c
		return
	case c != 0 || own:
		xw.uncount(loc) // and no name left
	default:
		xw.uncount(loc) // still named by the block's own hash
		return
	}
	r, off := l.t.unpack(loc)
	if r != l.r {
		l.release()
		r.mu.Lock()
		l.r = r
	}
	r.leave(xw, off)
	l.last = off
	l.left++
}

// release settles and unlocks the run in hand.
func (l *leaver) release() {
	if l.r != nil {
		l.t.settle(l.r, l.xw)
		l.r = nil
	}
}

// leave makes xw stop holding position off of r (locked), which it holds.
func (r *crun) leave(xw *xworker, off uint32) {
	hs := r.holderArray()
	i, _ := holderOf(hs, xw)
	r.leaveAt(xw, hs, i, off, off+1)
}

// leaveAt makes xw, the holder at i of hs (r's, locked), stop holding
// positions from..to-1 of r, every one of which it holds.
func (r *crun) leaveAt(xw *xworker, hs []holder, i int, from, to uint32) {
	h := &hs[i]
	clearBits(h.bits, from, to)
	h.held -= to - from
	if from < atomic.LoadUint32(&h.cut) {
		atomic.StoreUint32(&h.cut, from)
	}
	switch {
	case h.held == 0:
		r.dropHolderAt(hs, i)
		delete(xw.runs, r)
	case to == h.top:
		// Words above the new top are zero: drop them, so that the next
		// search for the top starts near it (tail-first eviction stays
		// constant per block at any run length).
		top := highestBit(h.bits)
		atomic.StoreUint32(&h.top, top)
		h.bits = h.bits[:(top+63)/64]
	}
}

// highestBit returns the highest set position + 1 (0 if none).
func highestBit(ws []uint64) uint32 {
	for i := len(ws) - 1; i >= 0; i-- {
		if ws[i] != 0 {
			return uint32(64*i + 64 - bits.LeadingZeros64(ws[i]))
		}
	}
	return 0
}

// extent is how many leading blocks of r are needed: up to the highest
// held by anyone or followed by a child run.
func (r *crun) extent() uint32 {
	return max(r.kidsExtent(), r.holdersExtent())
}

// holdersExtent is how many leading blocks of r its holders need. It
// needs no lock of r's (see unkid).
func (r *crun) holdersExtent() uint32 {
	var e uint32
	hs := r.holderArray()
	for i := range hs {
		e = max(e, atomic.LoadUint32(&hs[i].top))
	}
	return e
}

// kidsExtent is how many leading blocks of r its children need. It needs
// no lock of r's (see unkid).
func (r *crun) kidsExtent() uint32 {
	ks := r.kids.Load()
	if ks == nil {
		return 0
	}
	for i := len(*ks) - 1; i >= 0; i-- {
		if k := (*ks)[i]; k.n.Load() > 0 {
			return k.off + 1
		}
	}
	return 0
}

// settle trims r's unneeded tail, or deletes r (and settles its parents)
// if nothing of it is needed; r is locked, and settle unlocks it; xw is
// the worker whose event settles it (its writer stripe held: a run
// deleted frees its id there, see runTable). A run to delete is first
// trimmed to its first block here: drop deletes a top-level run under its
// root stripe too, which every store of that first block takes.
func (t *CompressedTree) settle(r *crun, xw *xworker) {
	e := r.extent()
	t.trim(r, max(e, 1))
	r.mu.Unlock()
	if e == 0 {
		t.at(hookSettled)
		t.drop(r, xw)
	}
}

// trim shortens r (locked) to e blocks, if longer, releasing the table's
// entries of the blocks trimmed. The array stays: no reader's view
// changes, and a later push past e takes a fresh one (crun.hw). The
// version tells readers that a cut they read may belong to blocks written
// after the keys they compared.
func (t *CompressedTree) trim(r *crun, e uint32) {
	n := r.n.Load()
	if e >= n {
		return
	}
	eng := *r.eng.Load()
	// Each release is a random line of the table and ends in a
	// compare-and-swap, after which no load overlaps: ask for the lines
	// peekAhead releases ahead.
	for off := e; off < min(e+peekAhead, n); off++ {
		if hasBit(r.claimed, off) {
			t.chain.prepare(eng[off])
		}
	}
	for off := e; off < n; off++ {
		if q := off + peekAhead; q < n && hasBit(r.claimed, q) {
			t.chain.prepare(eng[q])
		}
		if hasBit(r.claimed, off) {
			t.chain.release(eng[off], pack(r, off))
		}
	}
	if w := int(e+63) / 64; w <= len(r.claimed) {
		clear(r.claimed[w:])
		r.claimed = r.claimed[:w]
		if e%64 != 0 {
			r.claimed[w-1] &= 1<<(e%64) - 1 // the word of position e, if the bitset reaches it
		}
	}
	r.n.Store(e)
	r.ver.Add(1)
}

// drop deletes r, unlocked, if it is still unneeded once its lock is
// taken, then settles its parent, and so on up; xw as for settle. A child
// run is deleted under its own lock alone: a walk finds a child through
// heads and checks that it is not dead once it holds its lock (descend,
// branch), and its parent counts it until it is dead. Under the parent's
// lock too, siblings made and deleted under one shared run queued on it
// (results/README.md, "Again at c4a34a2").
func (t *CompressedTree) drop(r *crun, xw *xworker) {
	for r != nil {
		p := r.parent
		if p == nil {
			t.dropTop(r, xw)
			return
		}
		r.mu.Lock()
		if !t.kill(r, xw) {
			return
		}
		r = t.unkid(p, r.parentOff)
	}
}

// dropTop deletes r, a top-level run, under its root stripe: a store of
// its first block finds or makes it under the stripe (walker.top).
func (t *CompressedTree) dropTop(r *crun, xw *xworker) {
	up := t.rootLock(r.first)
	up.Lock()
	r.mu.Lock()
	t.kill(r, xw)
	up.Unlock()
}

// kill deletes r (locked) if nothing of it is needed, and unlocks it. It
// returns false if r was deleted already, or is needed: a store entered
// it while it was unlocked, and it is trimmed to what that store (and
// anyone else) needs of it.
func (t *CompressedTree) kill(r *crun, xw *xworker) bool {
	if r.dead {
		r.mu.Unlock()
		return false
	}
	if e := r.extent(); e > 0 {
		t.trim(r, e)
		r.mu.Unlock()
		return false
	}
	r.dead = true
	t.trim(r, 0)
	t.unhang(r)
	t.runs.del(r.id, &t.stripe(xw.worker.ID).ids)
	r.mu.Unlock()
	return true
}

// unkid stops p counting a child run at position off and trims p, under
// its lock, if the child was what kept p's tail; it returns p if nothing
// of p is needed any more (the caller drops it). The lock is not taken
// where p's length is all needed, read without it: whoever lowers a
// holder of p holds p's lock and then reads p's children (settle), so
// either it sees the count given back here or its holder is seen here,
// read after.
func (t *CompressedTree) unkid(p *crun, off uint32) *crun {
	if max(p.uncountKid(off), p.holdersExtent()) >= p.n.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		return nil
	}
	e := p.extent()
	if e == 0 {
		return p
	}
	t.trim(p, e)
	return nil
}

// unhang removes r from the map, atomically with other changes to its
// key's chain; readers already on it can still follow the chain.
func (t *CompressedTree) unhang(r *crun) {
	t.heads.Compute(t.edgeKey(r.parent, r.parentOff, r.first), func(head *crun, _ bool) (*crun, xsync.ComputeOp) {
		if head == r {
			if next := r.collide.Load(); next != nil {
				return next, xsync.UpdateOp
			}
			return nil, xsync.DeleteOp
		}
		for head.collide.Load() != r {
			head = head.collide.Load()
		}
		head.collide.Store(r.collide.Load())
		return nil, xsync.CancelOp
	})
}
