package radix

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/kvradix/kvradix/kvevent"
)

// storeScratch holds a store's per-block buffers, reused across events.
type storeScratch struct {
	locs  []uint64  // each block's location
	fresh []bool    // whether the walk made the worker hold the block
	old   []oldName // names the event moved to other blocks
	// The next run a walk makes and its arrays, allocated before the store
	// takes a lock: a walk makes a run under its parent's lock (or root
	// stripe), shared by every path through it, where an allocation can
	// hold it for a collection's assist.
	spare       *crun
	spareArrays *oneBlock
}

// oneBlock is a new run's arrays, room for its first block: its tokens
// hash and engine hash, and the two slices over them that crun.keys and
// crun.eng point to, in one allocation.
type oneBlock struct {
	hashes [2]uint64
	arrays [2][]uint64
}

// oldName is a block a worker named by a hash the event moves elsewhere.
type oldName struct {
	loc uint64
	own bool // the block's own hash (else one of the worker's xnames)
}

// store applies a Stored event in two passes:
//
//  1. walk: pass the leading blocks the worker holds already (held: no
//     lock, nothing to change), then find or create each other block's
//     place along the path, run by run under the runs' locks, make the
//     worker hold it (one holder update per run, not per block) and name
//     it: by its own hash if the event's hash is the block's (the common
//     case: no table access), else by a name of the worker's own. A
//     created block claims its hash in the table.
//  2. leave the blocks whose names the event moved, last, so that the
//     path just stored is never trimmed.
func (t *CompressedTree) store(w kvevent.Worker, d kvevent.Stored) error {
	if err := checkChain(w, d); err != nil {
		return err
	}
	if len(d.Blocks) > 0 {
		// Ask for the first block's slot in the table now, for its claim,
		// so that the miss overlaps the parent's and the runs': an event
		// of one block (a decode step's) has no claims ahead to overlap.
		t.chain.prepare(d.Blocks[0].BlockHash)
	}
	st := t.stripe(w.ID)
	xw := t.holder(st, w)
	others := otherTiersOf(t.workers, &t.tiered, w)
	var parent uint64 // the root
	if d.HasParent {
		ok := false
		if xw != nil {
			if parent, ok = t.tipOf(xw, d.ParentHash, len(d.Blocks) == 1); !ok {
				parent, _, ok = t.nameOf(xw, d.ParentHash)
			}
		}
		// A block stored in one tier may hang under one held in another:
		// the worker's other holders are written by this goroutine too, so
		// the parent stays held while the store runs.
		for _, o := range others {
			if !ok && o != nil {
				parent, _, ok = t.nameOf(o, d.ParentHash)
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
		st.last = xw
	}
	s := st.storeScratch()
	if s.spare == nil {
		s.spare, s.spareArrays = new(crun), new(oneBlock)
	}
	n := len(d.Blocks)
	s.locs, s.fresh, s.old = slices.Grow(s.locs[:0], n)[:n], slices.Grow(s.fresh[:0], n)[:n], s.old[:0]
	joined := t.walk(xw, parent, d.Blocks, s)
	l := leaver{t: t, xw: xw}
	for _, o := range s.old {
		l.unname(o.loc, o.own)
	}
	l.release()
	t.addSize(xw, joined-l.left) // once per event, not per block
	t.moved(others, d.Blocks, s.locs)
	t.tip(xw, d.Blocks[n-1].BlockHash, s.locs[n-1])
	s.shrink()
	return nil
}

// storeScratch returns the stripe's store scratch, for a writer holding it.
func (st *writerStripe) storeScratch() *storeScratch {
	if st.scratch == nil {
		st.scratch = &storeScratch{}
	}
	return st.scratch
}

// keptScratch is the most blocks a stripe's scratch keeps room for after
// a store: a larger event's arrays go with it, so that 16 stripes do not
// hold on to the largest event each has seen.
const keptScratch = 4096

// shrink lets arrays grown past keptScratch go.
func (s *storeScratch) shrink() {
	if cap(s.locs) > keptScratch {
		s.locs, s.fresh = nil, nil
	}
	if cap(s.old) > keptScratch {
		s.old = nil
	}
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
			if loc, _, ok := t.nameOf(o, b.BlockHash); ok && loc != locs[i] {
				gone = append(gone, b.BlockHash)
			}
		}
		if len(gone) > 0 {
			_ = t.remove(o.worker, gone) // all held: no error
		}
	}
}

// tipCache holds where a worker's recent stores ended: an engine decoding
// stores a block an event for each sequence that filled one, under the
// block the sequence's last store ended with (vLLM), and finds its parent
// here instead of in the table, where it is a random line of a large
// table (the run's lines it reads instead are the ones its walk reads
// next). A tip is kept as the table keeps an entry (chainTable.encode: the
// hash's fingerprint and the block's location, 8 bytes), at the
// fingerprint's low bits. The cache starts at minTips slots and doubles,
// up to maxTips, each time one-block stores under a parent have missed it
// as many times as it has slots: a worker decoding more sequences than it
// has room for; a worker that stores whole prompts keeps 128 bytes.
type tipCache struct {
	slots  []uint64
	missed int
}

const (
	minTips = 16
	maxTips = 1024
)

// tip remembers that a store of xw ended at loc, the block xw names by h.
func (t *CompressedTree) tip(xw *xworker, h, loc uint64) {
	if xw.tips == nil {
		xw.tips = &tipCache{slots: make([]uint64, minTips)}
	}
	fp := t.chain.fingerprint(h)
	if v, ok := t.chain.encode(fp, loc); ok { // else not claimed: no tip
		xw.tips.put(fp, v)
	}
}

func (c *tipCache) put(fp, v uint64) { c.slots[fp&uint64(len(c.slots)-1)] = v }

// tipOf returns the block a recent store of xw ended at, if xw names it by
// h: what nameOf would return, read from the run (namesOwnAt). decoding
// says the store asking is of one block (see tipCache).
func (t *CompressedTree) tipOf(xw *xworker, h uint64, decoding bool) (uint64, bool) {
	c := xw.tips
	if c == nil {
		return 0, false
	}
	fp := t.chain.fingerprint(h)
	if v := c.slots[fp&uint64(len(c.slots)-1)]; isEntry(v) && slotFP(v) == fp {
		loc := decode(v)
		if r, off := t.unpack(loc); r != nil && xw.namesOwnAt(loc, r, off, h) {
			return loc, true
		}
	}
	if decoding {
		c.miss()
	}
	return 0, false
}

// miss counts a one-block store's miss, doubling the cache (its tips kept)
// once they are as many as its slots.
func (c *tipCache) miss() {
	if c.missed++; c.missed < len(c.slots) || len(c.slots) >= maxTips {
		return
	}
	old := c.slots
	c.slots, c.missed = make([]uint64, 2*len(old)), 0
	for _, v := range old {
		if isEntry(v) {
			c.put(slotFP(v), v)
		}
	}
}

// nameOf returns the block xw names by engine hash h, and whether h is
// that block's own hash.
func (t *CompressedTree) nameOf(xw *xworker, h uint64) (loc uint64, own, ok bool) {
	if loc, ok := xw.xname(h); ok {
		return loc, false, true
	}
	if loc, ok := t.chain.find(h); ok && t.holdsOwn(xw, loc) {
		return loc, true, true
	}
	return 0, false, false
}

// holdsOwn reports whether xw holds the block at loc by its own hash. It
// reads the run without its lock: xw's bits are written only by the
// goroutine asking.
func (t *CompressedTree) holdsOwn(xw *xworker, loc uint64) bool {
	r, off := t.unpack(loc)
	return r != nil && xw.holdsOwnAt(loc, r, off)
}

// holdsOwnAt is holdsOwn of loc, the location of position off of r.
func (xw *xworker) holdsOwnAt(loc uint64, r *crun, off uint32) bool {
	if xw.count(loc)&noOwn != 0 {
		return false
	}
	hs := r.holderArray()
	i, found := holderOf(hs, xw)
	return found && hs[i].has(off)
}

// namesOwnAt reports whether xw names the block at loc (position off of
// r) by h, its own hash: then the block is the table's entry for h and xw
// has no name of its own for h, so nameOf(xw, h) would return loc, own.
// It reads r without its lock, as held explains.
func (xw *xworker) namesOwnAt(loc uint64, r *crun, off uint32, h uint64) bool {
	return xw.holdsOwnAt(loc, r, off) && (*r.eng.Load())[off] == h
}

// peekAhead is how many blocks ahead of its claims a store asks for the
// table's slots (chainTable.prepare), and a removal for those it looks up
// or releases.
const peekAhead = 8

// walker is the state of a store's walk (pass 1): the run it is in,
// locked, with its writer-side keys and length (published when the walk
// leaves the run), and the event's blocks placed in it so far.
type walker struct {
	t      *CompressedTree
	xw     *xworker
	s      *storeScratch
	blocks []kvevent.StoredBlock
	r      *crun
	ks     []uint64 // the run's keys and engine hashes, as written
	eng    []uint64
	n, off uint32 // the run's length; the position last reached
	from   uint32 // the position of the first block placed in r
	first  int    // that block's index in the event
	made   uint32 // the first position the walk created in r (n if none)
	joined int    // blocks the worker holds that it did not
}

// walk places and names every block (pass 1 of store): s.locs, s.fresh
// and s.old; it returns how many blocks the worker holds that it did not.
func (t *CompressedTree) walk(xw *xworker, parent uint64, blocks []kvevent.StoredBlock, s *storeScratch) int {
	wk := walker{t: t, xw: xw, s: s, blocks: blocks}
	i, parent := t.held(xw, parent, blocks, s.locs)
	if i == len(blocks) {
		return 0
	}
	if parent != 0 {
		r, off := t.unpack(parent) // held by xw, so live
		if wk.branch(r, off, i) {
			i++
		} else {
			t.descend(nil, r) // true: held by xw, r is live
			wk.resume(r, off, i)
		}
	} else {
		for !wk.top() {
		}
		i = 1
	}
	for i < len(blocks) {
		i = wk.step(i, len(blocks)-i)
	}
	wk.leave()
	wk.r.mu.Unlock()
	return wk.joined
}

// held places, without a lock, the event's leading blocks that xw already
// holds by their own hashes, under parent (0: the root): it returns how many
// (their locations in locs) and the last one's location (parent if none).
// Their walk would change nothing: the worker holds them and names them
// so, and the walk of the rest starts from the last one, so that a store
// of a prefix the worker holds (a whole request stored from the root, or a
// prefix-cache hit re-reported) locks no run of it, where every walk from
// the root used to queue on the first run's lock, shared by every request
// (results/README.md, "Sixteen cores").
//
// It reads the runs' tokens hashes as lookups do (view), and trusts a
// position only where xw holds it: xw's holder entries are written by this
// goroutine alone; a held position is below every length published since
// it was taken (no run is trimmed below a holder's position), so every
// array loaded since has its blocks, written before the hold. Its claim
// on its own hash dates from its creation and lasts as long as the block,
// and xw, holding it by that hash (noOwn clear), has no name of its own
// for the hash (a name of its own given to the hash takes the block's
// from it: name, unname). The search leaves the parent's run for a child
// only once a block is placed: an engine's event usually starts with a
// block it did not have, and a lookup here would be one the walk makes
// again.
func (t *CompressedTree) held(xw *xworker, parent uint64, blocks []kvevent.StoredBlock, locs []uint64) (int, uint64) {
	var r *crun // nil: the root
	var off uint32
	var ks []uint64
	if parent != 0 {
		r, off = t.unpack(parent)
		ks = r.view()
	}
	for i, b := range blocks {
		switch {
		case r != nil && int(off)+1 < len(ks) && ks[off+1] == b.TokensHash:
			off++
		case r != nil && i == 0:
			return 0, parent
		default:
			c := t.child(r, off, b.TokensHash)
			if c == nil {
				return i, parent
			}
			r, off, ks = c, 0, c.view()
		}
		loc := pack(r, off)
		if !xw.namesOwnAt(loc, r, off, b.BlockHash) {
			return i, parent
		}
		locs[i], parent = loc, loc
	}
	return len(blocks), parent
}

// top enters the top-level run of the event's first block, made if none,
// and places the block at its first position; false if the run was
// deleted while the walk waited for its lock.
func (wk *walker) top() bool {
	t, b := wk.t, wk.blocks[0]
	root := t.rootLock(b.TokensHash)
	root.Lock()
	r := t.child(nil, 0, b.TokensHash)
	made := r == nil
	if made {
		r, made = t.hang(wk.xw, wk.s, nil, 0, b)
	}
	if !t.descend(root, r) {
		return false
	}
	wk.enter(r, 0, 0, made)
	wk.s.locs[0] = pack(r, 0)
	return true
}

// descend takes the lock of run r, found or made under the lock up (r's
// parent's, or its root stripe; held, unless nil: found or made without
// it), and releases up. Where r is free that is hand over hand. Where it
// is not, up goes first: a walk waiting there would hold up every store
// through up's run, as the first run's lock held 16 writers
// (results/README.md, "Sixteen cores"). It returns false, unlocked, if r
// was deleted meanwhile (a child run is deleted without its parent's
// lock: drop): the caller looks again under up.
func (t *CompressedTree) descend(up *sync.Mutex, r *crun) bool {
	free := r.mu.TryLock()
	if up != nil {
		up.Unlock()
	}
	if !free {
		t.at(hookDescend)
		r.mu.Lock()
	}
	if r.dead {
		r.mu.Unlock()
		return false
	}
	return true
}

// branch enters, locked, the child run that block i starts at position
// off of p, which the walk's worker holds (so p keeps it), without p's
// lock, making the child if there is none: siblings made and deleted
// under one shared run (new conversations under a system prompt) queued
// on its lock, 16 writers no faster than 4 (results/README.md, "Again at
// c4a34a2"). It reports false where the block may belong in p itself (p's
// own next block, or p's end with no child there: p may be extended), for
// the walk under p's lock.
func (wk *walker) branch(p *crun, off uint32, i int) bool {
	t, b := wk.t, wk.blocks[i]
	if !p.mayBranch(off, b.TokensHash) {
		return false
	}
	for {
		c := t.child(p, off, b.TokensHash)
		made := false
		if c == nil {
			t.at(hookBranch)
			if !t.mayHang(p, off, b.TokensHash) {
				return false
			}
			if c, made = t.hang(wk.xw, wk.s, p, off, b); !made {
				t.unkid(p, off) // nil: the worker holds off, so p stays
			}
		}
		if !t.descend(nil, c) { // deleted before we took its lock: look again
			continue
		}
		wk.enter(c, 0, i, made)
		wk.s.locs[i] = pack(c, 0)
		return true
	}
}

// resume starts on r, locked, after position off, where the walk has
// placed block i-1 (or where it hangs, for i = 0).
func (wk *walker) resume(r *crun, off uint32, i int) {
	wk.enter(r, off+1, i, false)
	wk.off = off
}

// enter starts on r, locked, where block first will be at position from;
// made: the walk created r.
func (wk *walker) enter(r *crun, from uint32, first int, made bool) {
	wk.r, wk.ks, wk.eng, wk.n = r, *r.keys.Load(), *r.eng.Load(), r.n.Load()
	wk.off, wk.from, wk.first = from, from, first
	wk.made = wk.n
	if made {
		wk.made = 0
	}
}

// step places block i after the last one; room is how many blocks the
// event stores from here on (this one included), so that a run the event
// extends (or creates: its first push) is sized once. A run is extended
// up to runLimit blocks; a path goes on past it in a child run. A run is
// not extended where children hang from its end either: the paths diverge
// there, and one of them in the run would hold the run's lock (shared
// with every path through it) for its whole store, and trim the run under
// it as it is evicted (BenchmarkApplyParallel on 16 cores:
// results/README.md, "Sixteen cores"). Nor is a long run extended where
// that would copy it for blocks other than its array's past a length it
// was trimmed to, or for a decode step's one block (see extends). It
// returns the index of the next block to place: past those the run's
// extension took (appendTail).
func (wk *walker) step(i int, room int) int {
	key := wk.blocks[i].TokensHash
	r, next := wk.r, wk.off+1
	if next < wk.n && wk.ks[next] == key { // the run's own next block
		wk.off = next
		wk.s.locs[i] = pack(r, next)
		return i + 1
	}
	var c *crun
	end := next == wk.n
	// Children hang only below the published length (r's lock held: it
	// stays), none made there without the lock while none is (mayHang).
	kids := end && wk.off < r.n.Load() && r.hasKids(wk.off)
	if !end || kids {
		c = wk.t.child(r, wk.off, key)
	}
	if c == nil && end && !kids && next < wk.t.runLimit && wk.extends(wk.blocks[i], room) {
		// The run's end, and no child run hangs there: extend the run.
		wk.push(wk.blocks[i], room)
		wk.off = next
		wk.s.locs[i] = pack(r, next)
		return wk.appendTail(i + 1)
	}
	made := c == nil
	if made {
		r.countKid(wk.off)
		if c, made = wk.t.hang(wk.xw, wk.s, r, wk.off, wk.blocks[i]); !made {
			r.uncountKid(wk.off) // r is locked: whoever settles it next sees it
		}
	}
	wk.leave()
	if !wk.t.descend(&r.mu, c) {
		// Deleted while the walk waited: r is live (the worker holds its
		// position wk.off, as the walk placed it or hangs from it).
		r.mu.Lock()
		wk.resume(r, wk.off, i)
		return wk.step(i, room)
	}
	wk.enter(c, 0, i, made)
	wk.s.locs[i] = pack(c, 0)
	return i + 1
}

// appendTail places the event's blocks from i on at the end of the run,
// which the walk has just extended (past its published length: no child
// hangs there), while its arrays have room for them and hold no block past
// its end (see push): there step would push each, and extends allows it
// (arrays are at most runLimit long). It returns the index of the first
// block it did not place. A prompt's new blocks are then a copy each.
func (wk *walker) appendTail(i int) int {
	r := wk.r
	if wk.n < r.hw {
		return i
	}
	for end := uint32(len(wk.ks)); i < len(wk.blocks) && wk.n < end; i++ {
		b := wk.blocks[i]
		wk.ks[wk.n], wk.eng[wk.n] = b.TokensHash, b.BlockHash
		wk.s.locs[i] = pack(r, wk.n)
		wk.off = wk.n
		wk.n++
	}
	return i
}

// push appends block b at the run's end (unpublished until leave), growing
// the arrays to fit room blocks more (the rest of the event may extend the
// run too), or doubling them, so that runs extended in small steps (a
// conversation's turns) still append in amortised constant time, each
// block copied about once, for arrays at most half empty (growth by an
// eighth copied a block eight times, by half twice: results/README.md
// weighs the memory against the time). An array once
// published past this length (the run was trimmed) is not written again:
// the run gets a fresh one, unless the block is the one the array holds
// there already (revived: see below). Both arrays are written plainly:
// nobody reads past the length published (crun.eng). The block claims its
// own hash when the walk leaves the run.
//
// A block trimmed and stored again, as an engine evicts and recomputes
// it, is revived where the array still holds it (the same tokens hash and
// engine hash at the position): the walk takes the position back without
// writing it, so a reader still reading the array before the trim reads
// the same block there, and the run is not copied, a copy of the whole
// run each time its tail is evicted and stored again
// (BenchmarkApplyParallel, tail=same).
func (wk *walker) push(b kvevent.StoredBlock, room int) {
	r, n := wk.r, wk.n
	if wk.revives(b) {
		wk.n++
		return
	}
	if int(n) == len(wk.ks) || n < r.hw {
		size := min(int(n)+max(room, int(n), 1), int(wk.t.runLimit))
		a := newArrays(size)
		copy(a[0], wk.ks[:n])
		copy(a[1], wk.eng[:n])
		r.keys.Store(&a[0])
		r.eng.Store(&a[1])
		wk.ks, wk.eng, r.hw = a[0], a[1], n
		r.lone = room == 1
	}
	wk.ks[n], wk.eng[n] = b.TokensHash, b.BlockHash
	wk.n++
}

// newArrays returns a run's tokens hashes and engine hashes for size
// blocks, and the headers the run points at, in three allocations, where
// each header took one of its own. One buffer for both arrays would save
// another, but the allocator's size classes then waste more: T1's bytes
// a pair went from 19.90 to 19.96.
func newArrays(size int) *[2][]uint64 {
	return &[2][]uint64{make([]uint64, size), make([]uint64, size)}
}

// revives reports whether block b is the one the run's array holds at the
// walk's length, past the length the run was trimmed to (see push).
func (wk *walker) revives(b kvevent.StoredBlock) bool {
	n := wk.n
	return n < wk.r.hw && wk.ks[n] == b.TokensHash && wk.eng[n] == b.BlockHash
}

// extends reports whether block b, the first of the room blocks the
// event stores from here on, may go on in the run, at its end. Not where
// push would copy a run longer than copyLimit for it, in two cases; b
// goes on in a child run instead, at a cost that does not grow with the
// run:
//   - the run was trimmed from past its end, and b is not the block its
//     array holds there. A document asked one question after another,
//     each evicted before the next, would have its run copied for every
//     question (BenchmarkApplyParallel, tail=alternate).
//   - b is an event's only block left (a decode step's), and the run's
//     array is full and last grew for blocks stored together (a prompt,
//     stored at once or in chunks, sizes it for its blocks). Doubling it
//     would copy the whole prompt for the first block its sequence
//     decodes, and leave up to half of it empty for as long as the prompt
//     is held: a decoding engine's prompts would take nearly twice their
//     memory (BenchmarkDecodeMemory: 349 bytes a decoded block against 37
//     at 256 sequences a worker). The child run's array starts at one
//     block and doubles as its sequence decodes (lone): a long decode
//     stays in one run. A lookup of the decoded path crosses that one
//     run more (+0.2-0.5 µs here: results/decode-forks.txt).
//
// Blocks stored together (a conversation's next turn) extend a full run
// all the same: its array doubles, so that each block is copied about
// once however the run grows.
func (wk *walker) extends(b kvevent.StoredBlock, room int) bool {
	if wk.n <= wk.t.copyLimit || wk.revives(b) {
		return true
	}
	if wk.n < wk.r.hw {
		return false // trimmed past its end
	}
	return room > 1 || wk.r.lone || int(wk.n) < len(wk.ks)
}

// copyLimitLen is the longest run push copies for a block that extends
// would put in a child run if the run were longer: about where the copy
// costs what a child run made and deleted does (a child run instead of a
// copy of 64 blocks was 4% faster, of 256 23%:
// results/applyparallel-revive.txt).
const copyLimitLen = 32

// claim makes the blocks the walk created in its run (locked) claim their
// own hashes in the table, unless other blocks have them. Each claim asks
// for the table's slot of the one peekAhead after it, so that their cache
// misses overlap.
func (wk *walker) claim() {
	r, eng := wk.r, wk.eng
	for p := wk.made; p < min(wk.made+peekAhead, wk.n); p++ {
		wk.t.chain.prepare(eng[p])
	}
	for p := wk.made; p < wk.n; p++ {
		if q := p + peekAhead; q < wk.n {
			wk.t.chain.prepare(eng[q])
		}
		if wk.t.chain.claim(eng[p], pack(r, p)) {
			setBit(&r.claimed, p)
		}
	}
}

// setBit sets bit i of the bitset.
func setBit(ws *[]uint64, i uint32) {
	for int(i/64) >= len(*ws) {
		*ws = append(*ws, 0)
	}
	(*ws)[i/64] |= 1 << (i % 64)
}

func hasBit(ws []uint64, i uint32) bool {
	return int(i/64) < len(ws) && ws[i/64]&(1<<(i%64)) != 0
}

// clearBits clears bits from..to-1 of ws.
func clearBits(ws []uint64, from, to uint32) {
	for from < to {
		w, m, next := wordMask(from, to)
		ws[w] &^= m
		from = next
	}
}

// setBits sets bits from..to-1 of ws, and returns how many were clear.
func setBits(ws []uint64, from, to uint32) uint32 {
	n := 0
	for from < to {
		w, m, next := wordMask(from, to)
		n += bits.OnesCount64(m &^ ws[w])
		ws[w] |= m
		from = next
	}
	return uint32(n)
}

// wordMask returns the word of bit from (< to) in a bitset, the mask of
// bits from..to-1 in it, and the first bit past them and it.
func wordMask(from, to uint32) (w int, m uint64, next uint32) {
	next = min(to, from/64*64+64)
	return int(from / 64), (1<<(next-from) - 1) << (from % 64), next // 1<<64 is 0: a whole word
}

// leave publishes the run's length, claims the blocks the walk created,
// makes the worker hold the blocks placed in it and names them; the caller
// releases the run's lock. The length goes first: the table's lookups
// read a block's engine hash only below it (crun.eng).
func (wk *walker) leave() {
	r := wk.r
	wk.t.at(hookLeave)
	if wk.n != r.n.Load() {
		r.n.Store(wk.n)
		r.hw = max(r.hw, wk.n)
	}
	wk.claim()
	if wk.off < wk.from {
		return
	}
	if wk.xw.plain() && wk.allOwn() {
		// All name would do for each block: count those joined.
		wk.joined += r.hold(wk.xw, wk.from, wk.off, nil)
		return
	}
	r.hold(wk.xw, wk.from, wk.off, wk.s.fresh[wk.first:wk.first+int(wk.off-wk.from)+1])
	for p := wk.from; p <= wk.off; p++ {
		wk.name(wk.first+int(p-wk.from), r, p, wk.own(p))
	}
}

// own reports whether the event names the block the walk placed at
// position p of its run by the block's own hash.
func (wk *walker) own(p uint32) bool {
	return hasBit(wk.r.claimed, p) && wk.eng[p] == wk.blocks[wk.first+int(p-wk.from)].BlockHash
}

// allOwn reports whether the event names every block the walk placed in
// its run by the block's own hash: for a plain worker, naming them then
// changes nothing but the count of blocks joined (see name).
func (wk *walker) allOwn() bool {
	for p := wk.from; p <= wk.off; p++ {
		if !wk.own(p) {
			return false
		}
	}
	return true
}

// name makes the worker name block i of the event, placed at position p of
// r, by its engine hash; own: the hash is the block's own. The worker's
// name for the hash elsewhere, if any, goes to s.old.
func (wk *walker) name(i int, r *crun, p uint32, own bool) {
	xw, h, fresh, loc := wk.xw, wk.blocks[i].BlockHash, wk.s.fresh[i], pack(r, p)
	if fresh {
		wk.joined++
	}
	if own {
		// The block's own hash: the worker names no other block by it,
		// unless by a name of its own.
		wk.s.keepOwn(loc)
		if q, ok := xw.xname(h); ok {
			delete(xw.xnames, h)
			wk.s.old = append(wk.s.old, oldName{q, false})
		}
		if c := xw.count(loc); !fresh && c&noOwn != 0 {
			xw.xcount[loc] = c &^ noOwn // held by names of its own until now
		}
		return
	}
	q, qOwn, ok := wk.t.nameOf(xw, h)
	if ok && q == loc {
		return // named so already
	}
	if ok && qOwn && wk.unnamed(q, p) {
		ok = false // held since this event's hold, named by a later block of it
	}
	if xw.xnames == nil {
		xw.xnames, xw.xcount = map[uint64]uint64{}, map[uint64]uint32{}
	}
	xw.xnames[h] = loc
	c := xw.xcount[loc] + 1
	if fresh {
		c |= noOwn
	}
	xw.xcount[loc] = c
	if ok {
		wk.s.old = append(wk.s.old, oldName{q, qOwn})
	}
}

// keepOwn drops from s.old the block at loc's own name, if the event moved
// it elsewhere earlier (an event may name a block it stores later by its
// own hash first: "12, 13, 12" over blocks whose own hashes are 10, 11,
// 12): the event names the block by it again, so the block keeps it.
func (s *storeScratch) keepOwn(loc uint64) {
	if i := slices.Index(s.old, oldName{loc, true}); i >= 0 {
		s.old = slices.Delete(s.old, i, i+1)
	}
}

// unnamed reports whether loc is a block the walk made the worker hold in
// its current run and has not named yet (p is being named).
func (wk *walker) unnamed(loc uint64, p uint32) bool {
	r, off := wk.t.unpack(loc)
	return r == wk.r && off > p && off <= wk.off && wk.s.fresh[wk.first+int(off-wk.from)]
}

// hold makes xw hold positions from..to of r (locked), setting fresh[i]
// for each position it did not hold (unless fresh is nil), and returns how
// many it did not; its cut is written once.
func (r *crun) hold(xw *xworker, from, to uint32, fresh []bool) int {
	hs := r.holderArray()
	i, found := holderOf(hs, xw)
	if !found {
		hs = r.addHolder(hs, i, xw)
		if xw.runs == nil {
			xw.runs = map[*crun]struct{}{}
		}
		xw.runs[r] = struct{}{}
	}
	h := &hs[i]
	for int(to/64) >= len(h.bits) {
		h.bits = append(h.bits, 0)
	}
	var n uint32
	if fresh == nil {
		n = setBits(h.bits, from, to+1)
	} else {
		for p := from; p <= to; p++ {
			word, bit := &h.bits[p/64], uint64(1)<<(p%64)
			f := *word&bit == 0
			fresh[p-from] = f
			if f {
				*word |= bit
				n++
			}
		}
	}
	h.held += n
	atomic.StoreUint32(&h.top, max(h.top, to+1))
	if cut := atomic.LoadUint32(&h.cut); cut >= from && cut <= to {
		for cut = to + 1; cut < h.top && h.has(cut); cut++ {
		}
		atomic.StoreUint32(&h.cut, cut)
	}
	return int(n)
}

// addHolder publishes r's holders hs with xw's new entry at i, and
// returns them.
func (r *crun) addHolder(hs []holder, i int, xw *xworker) []holder {
	if len(hs) == 0 {
		f := &firstHolder{}
		f.one[0] = holder{w: xw, bits: f.word[:0]}
		f.hs = f.one[:]
		r.holders.Store(&f.hs)
		return f.hs
	}
	grown := make([]holder, len(hs)+1)
	copy(grown, hs[:i])
	grown[i] = holder{w: xw}
	copy(grown[i+1:], hs[i:])
	if len(hs) == 1 {
		// The first holder's bits may be its firstHolder's word: copied
		// out, the rest of that object is not kept for it.
		if first := &grown[1-i]; cap(first.bits) == 1 {
			first.bits = slices.Clone(first.bits)
		}
	}
	r.holders.Store(&grown) // a variable of its own: &hs would move hs to the heap on every call
	return grown
}

// firstHolder is a run's holder array while it has one holder, with the
// first word of that holder's bits, in one allocation where they took
// three: every new run's first. A second holder copies that word out.
type firstHolder struct {
	hs   []holder
	one  [1]holder
	word [1]uint64
}

// holderOf returns the index of xw among hs (where it would be, if not
// there). It reads only the holders' w, which never changes: a writer
// may call it without the run's lock while others update their entries.
func holderOf(hs []holder, xw *xworker) (int, bool) {
	lo, hi := 0, len(hs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if hs[m].w.slot < xw.slot {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(hs) && hs[lo].w == xw
}

// kidAt returns the count of children at position off, nil if the set
// has none for it (a count there may be zero: see kidSet).
func (r *crun) kidAt(off uint32) *kidCount {
	ks := r.kids.Load()
	if ks == nil {
		return nil
	}
	i, found := slices.BinarySearchFunc(*ks, off, byOff)
	if !found {
		return nil
	}
	return (*ks)[i]
}

// byOff orders a kidSet by position.
func byOff(k *kidCount, off uint32) int { return int(k.off) - int(off) }

// kidsAt reports whether a child run hangs from position off.
func (r *crun) kidsAt(off uint32) bool {
	k := r.kidAt(off)
	return k != nil && k.n.Load() > 0
}

// hasKids reports whether a child run hangs from position off, for a walk
// holding r's lock about to extend r in place there: under kmu, so that it
// comes before or after a first child's check and count
// (CompressedTree.mayHang).
func (r *crun) hasKids(off uint32) bool {
	r.kmu.Lock()
	found := r.kidsAt(off)
	r.kmu.Unlock()
	return found
}

// mayBranch reports, without a lock, whether block key may start a child
// at position off of r: not if it is r's own next block, nor at r's end
// while no child hangs there (a store appending to a conversation), where
// the walk takes r's lock without looking for a child first. A false
// answer is always safe: that walk finds or makes the child too.
func (r *crun) mayBranch(off uint32, key uint64) bool {
	return r.childFits(off, key, r.kidsAt(off))
}

// childFits reports whether block key belongs in a child at position off
// of r: where it is not r's own next block, and at r's end only where
// children hang (kids), r being extended there otherwise.
func (r *crun) childFits(off uint32, key uint64, kids bool) bool {
	if ks := r.view(); int(off)+1 < len(ks) {
		return ks[off+1] != key
	}
	return kids
}

// mayHang counts a child of first block key at position off of r, about
// to be made without r's lock, if it belongs in a child: not where r's own
// next block is key, nor at r's end with no child there (a walk holding
// r's lock may extend r there: its blocks past the end are not published
// until it leaves, so that end is r's end here).
//
// Where children hang at off already, the count goes up by a
// compare-and-swap from a count above zero, and the check comes after,
// with r's blocks read after the count: a walk that extends r in place
// read no child there (hasKids), and no count rises from zero at r's end
// while it holds r's lock, so it extends only where this check sees its
// blocks, or sees r's end with children that were there before it looked
// (and it did not extend). A count from zero is counted with its check
// under kmu, as the walk's look is: the count of a child that does not
// fit must not lead another walk to count one more at r's end.
func (t *CompressedTree) mayHang(r *crun, off uint32, key uint64) bool {
	if k := r.kidAt(off); k != nil {
		for c := k.n.Load(); c > 0; c = k.n.Load() {
			if k.n.CompareAndSwap(c, c+1) {
				if r.childFits(off, key, true) {
					return true
				}
				k.n.Add(-1) // the worker holds off: r needs it still, untrimmed
				return false
			}
		}
	}
	r.kmu.Lock()
	defer r.kmu.Unlock()
	if !r.childFits(off, key, r.kidsAt(off)) {
		return false
	}
	t.at(hookFirstKid)
	r.addKid(off)
	return true
}

// countKid counts a child about to be made at position off.
func (r *crun) countKid(off uint32) {
	r.kmu.Lock()
	r.addKid(off)
	r.kmu.Unlock()
}

// uncountKid gives back the count of a child at position off, and
// returns how many leading blocks of r its children still need.
func (r *crun) uncountKid(off uint32) uint32 {
	r.kidAt(off).n.Add(-1) // counted: its position stays in the set
	return r.kidsExtent()
}

// addKid counts a child at position off (kmu held), in a new set if off
// is a new position.
func (r *crun) addKid(off uint32) {
	if k := r.kidAt(off); k != nil {
		k.n.Add(1)
		return
	}
	k := &kidCount{off: off}
	k.n.Store(1)
	var ks kidSet
	if old := r.kids.Load(); old != nil {
		ks = make(kidSet, 0, len(*old)+1)
		for _, o := range *old {
			if o.n.Load() > 0 { // a count at zero is not raised outside kmu
				ks = append(ks, o)
			}
		}
	}
	i, _ := slices.BinarySearchFunc(ks, off, byOff)
	ks = slices.Insert(ks, i, k)
	r.kids.Store(&ks)
}

// hang returns the run of block b hanging from position off of parent (nil:
// the root), made if none (true): found or made atomically in heads, since
// a walk may make it without parent's lock (branch). parent has counted
// it already (mayHang, or countKid under parent's lock); if one was found,
// made meanwhile by another walk, the caller gives the count back.
func (t *CompressedTree) hang(xw *xworker, s *storeScratch, parent *crun, off uint32, b kvevent.StoredBlock) (*crun, bool) {
	r := t.newRun(xw, s, parent, off, b)
	var found *crun
	// Prepend to the key's chain, atomically with other changes to it (the
	// chain may hold runs of other parents): a reader sees the chain with
	// or without the new run, both well formed.
	t.heads.Compute(t.edgeKey(parent, off, b.TokensHash), func(head *crun, loaded bool) (*crun, xsync.ComputeOp) {
		for c := head; c != nil; c = c.collide.Load() {
			if c.parent == parent && c.parentOff == off && c.first == b.TokensHash {
				found = c
				return head, xsync.CancelOp
			}
		}
		if loaded {
			r.collide.Store(head)
		}
		return r, xsync.UpdateOp
	})
	if found == nil {
		return r, true
	}
	t.runs.del(r.id, &t.stripe(xw.worker.ID).ids) // r was never found
	return found, false
}

// newRun creates a one-block run of block b to hang from position off of
// parent (see hang). Its arrays hold that block only: the walk's first
// push past it sizes them for the rest of the event, under the new run's
// lock alone. Sized here, they were allocated (zeroed, often in pages
// faulted in then) under the parent's lock, shared by every path through
// it: a new conversation under a system prompt held that run's lock 11 µs
// on average, most of a store from the root's time under a shared lock
// (results/held-prefix.txt). The run and its arrays are the store's spare, allocated before its
// first lock (storeScratch.spare): nothing is allocated here but for a
// second run of one store. Its id comes from the spare ids of the writer
// stripe of xw, the storing worker (held: see runTable).
func (t *CompressedTree) newRun(xw *xworker, s *storeScratch, parent *crun, off uint32, b kvevent.StoredBlock) *crun {
	key := b.TokensHash
	r, a := s.spare, s.spareArrays
	s.spare, s.spareArrays = nil, nil
	if r == nil { // a second run made by one store
		r, a = new(crun), new(oneBlock)
	}
	r.parent, r.parentOff, r.first, r.serial = parent, off, key, t.serial(xw.worker.ID)
	a.hashes = [2]uint64{key, b.BlockHash} // the engine hash claimed by the walk that makes it (walker.claim)
	a.arrays = [2][]uint64{a.hashes[:1:1], a.hashes[1:2:2]}
	r.keys.Store(&a.arrays[0])
	r.eng.Store(&a.arrays[1])
	r.n.Store(1)
	r.hw = 1
	t.runs.add(r, &t.stripe(xw.worker.ID).ids)
	return r
}
