package radix

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/kvradix/kvradix/kvevent"
)

// CompressedTree is the run-compressed exact index: consecutive blocks live
// in one contiguous array, so a request is compared against a run of blocks
// with one memory access and a memequal, and a worker's claim on a run is
// one number, not one map entry per block.
//
// # Layout
//
// A run is a path segment: the tokens hashes of consecutive blocks, and the
// workers holding any of them. A run hangs from a position of its parent
// run (any position, not only the last), found through one concurrent map
// keyed by a 64-bit mix of (parent run, parent position, first tokens
// hash); top-level runs hang from the root (a nil parent). The run records
// its edge and a lookup checks it, so the index stays exact even when two
// edges' keys collide: the map entry is then a chain of runs. A block is a (run, offset) pair for its
// whole life: runs are never split, so nothing that names a block has to
// be rewritten when the tree changes.
//
// Runs split where paths diverge, and only there: a Stored block extends
// its parent's run in place when the parent is the run's last block and no
// child run already starts with that block; it continues inside the run
// when the run's next block has its tokens hash; otherwise it starts (or
// enters) a child run. So the block after position p of a run is either
// the run's own next block or the first block of a child run, never both,
// and every path has exactly one place. Long shared prefixes (system
// prompts, earlier turns) become single runs; each divergence costs one
// map entry.
//
// Each holder of a run is a worker with
//
//   - cut: how many of the run's leading blocks it holds without a gap.
//     Lookups read only this: a request entering the run matches m blocks
//     by memequal, and a worker scores min(cut, m) there.
//   - a bitset of the positions it holds (holes included), its count and
//     the highest: the exact state, so that a hole refilled restores the
//     cut, and a run's unheld tail can be trimmed.
//
// A run's holders are an immutable array sorted by worker slot (copied when
// a worker joins or leaves the run); cuts are updated in place,
// atomically. Worker slots are small integers reused after a worker is
// forgotten; holders point at the worker itself, so a slot reused while a
// reader is mid-walk is never credited to the new worker.
//
// A run whose tail no worker holds and no child hangs from is trimmed; a run
// left with no holders and no children is deleted, and its parent settled
// in turn. So memory follows what is held: removing every worker leaves an
// empty tree.
//
// Each worker maps its engine block hashes to blocks in a compact
// open-addressing table (16 bytes an entry). Apart from that table, a held
// block costs one bit; a distinct block costs its 8-byte tokens hash.
//
// # Concurrency contract
//
//   - Writers (Apply, RemoveWorker) may be called from any goroutines; they
//     serialise on one mutex, held for one event. (shardpool.Pool pins each
//     worker to a lane, which this index does not need but does not mind.)
//   - FindMatches, Size and TreeSizes may run at any time from any number of
//     goroutines; they take no lock and write nothing shared. A reader sees
//     each run's length, tokens hashes, holder array and each cut as values
//     that existed at some moment, but different runs (and different cuts)
//     at different moments: mid-event, a reader may see some of an event's
//     blocks and not others. A worker's cut only ever counts blocks it held
//     without a gap when the cut was written, and a reader scores a worker
//     only through runs whose cut it read, so a score never exceeds the
//     prefix the worker stored.
//   - Dump takes the writers' mutex.
type CompressedTree struct {
	once     sync.Once                 // see ready
	heads    *xsync.Map[uint64, *crun] // edgeKey -> runs hanging there (a chain on collisions)
	edgeMask uint64                    // ^0; tests narrow it to force collisions
	size     atomic.Int64
	scratch  sync.Pool // *cmatchScratch

	mu       sync.Mutex // guards everything below, and every run's writer-side state
	runs     []*crun    // run id -> run; id 0 is never used
	freeRuns []uint32
	workers  map[kvevent.Worker]*xworker
	freeSlot []uint32
	slots    uint32 // slots handed out so far
	serials  uint64 // runs created so far
}

// crun is one run of blocks.
type crun struct {
	// Read by lookups (see view). keys is the backing array (len =
	// capacity); only its first n entries are blocks. An array is never
	// written below a length published for it: trimming replaces it.
	keys    atomic.Pointer[[]uint64]
	n       atomic.Uint32
	holders atomic.Pointer[[]holder] // sorted by slot; immutable but for cuts
	collide atomic.Pointer[crun]     // the next run whose edge has the same key

	// Where the run hangs; immutable.
	parent    *crun // nil: the root
	parentOff uint32
	first     uint64 // the first block's tokens hash
	serial    uint64 // unique for the tree's life, unlike id

	// Writer-side, under the tree's mutex.
	id   uint32
	kids []kidCount // child runs per position, by position
}

// edgeKey mixes where a run hangs into its map key (murmur3's finaliser).
func (t *CompressedTree) edgeKey(parent *crun, off uint32, key uint64) uint64 {
	var ps uint64
	if parent != nil {
		ps = parent.serial
	}
	x := key ^ ps*0x9E3779B97F4A7C15 ^ uint64(off)*0xC2B2AE3D27D4EB4F
	x ^= x >> 33
	x *= 0xFF51AFD7ED558CCD
	x ^= x >> 33
	x *= 0xC4CEB9FE1A85EC53
	x ^= x >> 33
	return x & t.edgeMask
}

// child returns the run hanging from position off of parent whose first
// block is key, or nil.
func (t *CompressedTree) child(parent *crun, off uint32, key uint64) *crun {
	r, _ := t.heads.Load(t.edgeKey(parent, off, key))
	for r != nil && (r.parent != parent || r.parentOff != off || r.first != key) {
		r = r.collide.Load()
	}
	return r
}

// kidCount counts the child runs hanging from one position.
type kidCount struct{ off, n uint32 }

// holder is a worker's claim on a run. Readers read w and cut (atomically);
// the rest is the writer's.
type holder struct {
	w    *xworker
	cut  uint32 // leading positions held without a gap; atomic
	top  uint32 // highest position held + 1
	held uint32 // positions held
	bits []uint64
}

func (h *holder) has(off uint32) bool {
	i := int(off / 64)
	return i < len(h.bits) && h.bits[i]&(1<<(off%64)) != 0
}

// xworker is one cache owner (a worker id and rank).
type xworker struct {
	worker  kvevent.Worker
	slot    uint32
	size    atomic.Int64      // blocks held
	eng     engineTable       // engine hash -> location; the writer's
	aliases map[uint64]uint32 // location -> engine hashes naming it beyond the first (nil: none); the writer's
}

// A location packs a run id (high half, >= 1) and an offset; 0 is the root.
func pack(r *crun, off uint32) uint64 { return uint64(r.id)<<32 | uint64(off) }

func (t *CompressedTree) unpack(loc uint64) (*crun, uint32) {
	return t.runs[loc>>32], uint32(loc)
}

// view returns the run's blocks as a reader may see them: a length read
// between two loads of the same array is a length of that array (a writer
// publishes a new array before the length that goes with it, and appends
// to an array only past every length published for it), so the blocks
// below it are written and stay put.
func (r *crun) view() []uint64 {
	for {
		p := r.keys.Load()
		n := r.n.Load()
		if r.keys.Load() == p {
			return (*p)[:min(int(n), len(*p))]
		}
	}
}

func (r *crun) holderArray() []holder {
	if p := r.holders.Load(); p != nil {
		return *p
	}
	return nil
}

// NewCompressedTree returns an empty tree.
// The zero CompressedTree is empty and ready to use.
func NewCompressedTree() *CompressedTree {
	t := &CompressedTree{}
	t.ready()
	return t
}

// ready initialises the tree on first use: a zero CompressedTree works, at
// the cost of one atomic load per call.
func (t *CompressedTree) ready() {
	t.once.Do(func() {
		t.heads = xsync.NewMap[uint64, *crun]()
		t.edgeMask = ^uint64(0)
		t.runs = []*crun{nil}
		t.workers = map[kvevent.Worker]*xworker{}
		t.scratch.New = func() any { return &cmatchScratch{} }
	})
}

// Apply implements Index. See the type's concurrency contract.
func (t *CompressedTree) Apply(ev kvevent.RouterEvent) error {
	t.ready()
	w := ev.Worker()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch d := ev.Event.Data.(type) {
	case kvevent.Stored:
		return t.store(w, d)
	case kvevent.Removed:
		return t.remove(w, d.BlockHashes)
	case kvevent.Cleared:
		if xw := t.workers[w]; xw != nil {
			t.forget(xw)
		}
		return nil
	}
	return fmt.Errorf("%w: event %d of worker %v has no data", ErrInvalidEvent, ev.Event.ID, w)
}

// worker returns w's state, registering it on first sight with the slot
// freed last, or a new one.
func (t *CompressedTree) worker(w kvevent.Worker) *xworker {
	if xw := t.workers[w]; xw != nil {
		return xw
	}
	xw := &xworker{worker: w}
	if n := len(t.freeSlot); n > 0 {
		xw.slot, t.freeSlot = t.freeSlot[n-1], t.freeSlot[:n-1]
	} else {
		xw.slot = t.slots
		t.slots++
	}
	t.workers[w] = xw
	return xw
}

// forget drops everything xw holds and releases its slot.
func (t *CompressedTree) forget(xw *xworker) {
	xw.eng.each(func(_, loc uint64) { t.unname(loc, xw) })
	xw.eng, xw.aliases = engineTable{}, nil
	delete(t.workers, xw.worker)
	t.freeSlot = append(t.freeSlot, xw.slot)
	if len(t.workers) == 0 {
		t.workers = map[kvevent.Worker]*xworker{} // a Go map keeps its buckets when emptied
	}
}

func (t *CompressedTree) store(w kvevent.Worker, d kvevent.Stored) error {
	if err := checkChain(w, d); err != nil {
		return err
	}
	xw := t.workers[w]
	var loc uint64 // the root
	if d.HasParent {
		ok := false
		if xw != nil {
			loc, ok = xw.eng.get(d.ParentHash)
		}
		if !ok {
			return fmt.Errorf("%w: worker %v, parent %#x", ErrParentNotFound, w, d.ParentHash)
		}
	}
	if len(d.Blocks) == 0 {
		return nil
	}
	if xw == nil {
		xw = t.worker(w)
	}
	xw.eng.warm(d.Blocks[:min(warmAhead, len(d.Blocks))])
	joined := 0
	for i, b := range d.Blocks {
		if i%warmAhead == 0 && i+warmAhead < len(d.Blocks) {
			xw.eng.warm(d.Blocks[i+warmAhead : min(i+2*warmAhead, len(d.Blocks))])
		}
		loc = t.next(loc, b.TokensHash, len(d.Blocks)-i)
		e, had := xw.eng.slot(b.BlockHash)
		old := e.loc
		if had && old == loc {
			continue
		}
		// Name the new block first, so that leaving old cannot trim the
		// path just walked.
		e.loc = loc
		if t.join(loc, xw) {
			joined++
		} else {
			if xw.aliases == nil {
				xw.aliases = map[uint64]uint32{}
			}
			xw.aliases[loc]++
		}
		if had {
			t.unname(old, xw)
		}
	}
	// Sizes once per event, not two atomic adds per block.
	xw.size.Add(int64(joined))
	t.size.Add(int64(joined))
	return nil
}

// warmAhead is how many blocks' engine-table slots a store loads ahead.
const warmAhead = 16

// next returns the block after loc with tokens hash key, creating it; room
// is how many blocks the event stores from here on (this one included), so
// that a run created or extended by the event is sized once.
func (t *CompressedTree) next(loc uint64, key uint64, room int) uint64 {
	var r *crun
	var off uint32
	if loc != 0 {
		r, off = t.unpack(loc)
		ks := r.view()
		switch {
		case int(off)+1 < len(ks) && ks[off+1] == key:
			return pack(r, off+1)
		case int(off)+1 == len(ks):
			// The run's end: extend it, unless a child run already has
			// this block.
			if r.hasKidAt(off) {
				if c := t.child(r, off, key); c != nil {
					return pack(c, 0)
				}
			}
			r.push(key, room)
			return pack(r, off+1)
		}
	}
	if c := t.child(r, off, key); c != nil {
		return pack(c, 0)
	}
	return pack(t.newRun(r, off, key, room), 0)
}

func (r *crun) kidAt(off uint32) (int, bool) {
	return slices.BinarySearchFunc(r.kids, off, func(k kidCount, off uint32) int { return int(k.off) - int(off) })
}

func (r *crun) hasKidAt(off uint32) bool {
	_, found := r.kidAt(off)
	return found
}

// push appends a block to the run, growing its array to fit room blocks
// more (the rest of the event extends the run too), or by an eighth, so that
// runs extended in small steps still append in amortised constant time.
func (r *crun) push(key uint64, room int) {
	n := r.n.Load()
	ks := *r.keys.Load()
	if int(n) == len(ks) {
		grown := make([]uint64, int(n)+max(room, int(n)/8, 1))
		copy(grown, ks)
		r.keys.Store(&grown)
		ks = grown
	}
	ks[n] = key
	r.n.Store(n + 1)
}

// newRun creates a one-block run hanging from position off of parent.
func (t *CompressedTree) newRun(parent *crun, off uint32, key uint64, room int) *crun {
	t.serials++
	r := &crun{parent: parent, parentOff: off, first: key, serial: t.serials}
	ks := make([]uint64, max(room, 1))
	ks[0] = key
	r.keys.Store(&ks)
	r.n.Store(1)
	if n := len(t.freeRuns); n > 0 {
		r.id, t.freeRuns = t.freeRuns[n-1], t.freeRuns[:n-1]
		t.runs[r.id] = r
	} else {
		r.id = uint32(len(t.runs))
		t.runs = append(t.runs, r)
	}
	if parent != nil {
		i, found := parent.kidAt(off)
		if found {
			parent.kids[i].n++
		} else {
			parent.kids = slices.Insert(parent.kids, i, kidCount{off, 1})
		}
	}
	// Prepend to the key's chain: a reader sees the chain with or without
	// the new run, both well formed.
	k := t.edgeKey(parent, off, key)
	if head, ok := t.heads.Load(k); ok {
		r.collide.Store(head)
	}
	t.heads.Store(k, r)
	return r
}

// unhang removes r from the map; readers already on it can still follow
// its chain.
func (t *CompressedTree) unhang(r *crun) {
	k := t.edgeKey(r.parent, r.parentOff, r.first)
	head, _ := t.heads.Load(k)
	if head == r {
		if next := r.collide.Load(); next != nil {
			t.heads.Store(k, next)
		} else {
			t.heads.Delete(k)
		}
		return
	}
	for head.collide.Load() != r {
		head = head.collide.Load()
	}
	head.collide.Store(r.collide.Load())
}

// holderOf returns the index of xw among hs.
func holderOf(hs []holder, xw *xworker) (int, bool) {
	return slices.BinarySearchFunc(hs, xw.slot, func(h holder, slot uint32) int { return int(h.w.slot) - int(slot) })
}

// join makes xw hold loc; it reports false if xw already held it.
func (t *CompressedTree) join(loc uint64, xw *xworker) bool {
	r, off := t.unpack(loc)
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
	if h.has(off) {
		return false
	}
	for int(off/64) >= len(h.bits) {
		h.bits = append(h.bits, 0)
	}
	h.bits[off/64] |= 1 << (off % 64)
	h.held++
	h.top = max(h.top, off+1)
	if cut := atomic.LoadUint32(&h.cut); off == cut {
		for cut++; cut < h.top && h.has(cut); cut++ {
		}
		atomic.StoreUint32(&h.cut, cut)
	}
	return true
}

// unname drops one engine hash of xw naming loc (the table entry is the
// caller's to delete); xw leaves loc with its last alias.
func (t *CompressedTree) unname(loc uint64, xw *xworker) {
	if !dropAlias(xw.aliases, loc) {
		t.leave(loc, xw)
	}
}

// leave makes xw stop holding loc, which it holds; the engine hash naming
// loc is the caller's to delete.
func (t *CompressedTree) leave(loc uint64, xw *xworker) {
	xw.size.Add(-1)
	t.size.Add(-1)
	r, off := t.unpack(loc)
	hs := r.holderArray()
	i, _ := holderOf(hs, xw)
	h := &hs[i]
	h.bits[off/64] &^= 1 << (off % 64)
	h.held--
	if off < atomic.LoadUint32(&h.cut) {
		atomic.StoreUint32(&h.cut, off)
	}
	switch {
	case h.held == 0:
		rest := slices.Delete(slices.Clone(hs), i, i+1)
		if len(rest) == 0 {
			r.holders.Store(nil)
		} else {
			r.holders.Store(&rest)
		}
	case off+1 == h.top:
		h.top = highestBit(h.bits)
	}
	if off+1 == r.n.Load() || h.held == 0 {
		t.settle(r)
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
	var e uint32
	hs := r.holderArray()
	for i := range hs {
		e = max(e, hs[i].top)
	}
	if k := len(r.kids); k > 0 {
		e = max(e, r.kids[k-1].off+1)
	}
	return e
}

// settle trims r's unneeded tail, or deletes r (and settles its parent) if
// nothing of it is needed.
func (t *CompressedTree) settle(r *crun) {
	for r != nil {
		e := r.extent()
		if e > 0 {
			if n := r.n.Load(); e < n {
				// A fresh array: readers that saw the old length read the
				// old one, which is never written again.
				ks := slices.Clone(r.view()[:e])
				r.keys.Store(&ks)
				r.n.Store(e)
			}
			return
		}
		p := r.parent
		t.unhang(r)
		t.runs[r.id] = nil
		t.freeRuns = append(t.freeRuns, r.id)
		if p == nil {
			return
		}
		i, _ := p.kidAt(r.parentOff)
		if p.kids[i].n--; p.kids[i].n == 0 {
			p.kids = slices.Delete(p.kids, i, i+1)
		}
		if len(p.kids) == 0 {
			p.kids = nil
		}
		r = p
	}
}

func (t *CompressedTree) remove(w kvevent.Worker, hashes []uint64) error {
	xw := t.workers[w]
	missing := 0
	for _, h := range hashes {
		var loc uint64
		ok := false
		if xw != nil {
			loc, ok = xw.eng.del(h)
		}
		if !ok {
			missing++
			continue
		}
		t.unname(loc, xw)
	}
	if xw != nil && xw.eng.len() == 0 {
		t.forget(xw)
	}
	if missing > 0 {
		return &MissingBlocksError{Worker: w, Missing: missing, Of: len(hashes)}
	}
	return nil
}

// RemoveWorker implements Index: every rank of id leaves every block and
// is forgotten.
func (t *CompressedTree) RemoveWorker(id kvevent.WorkerID) {
	t.ready()
	t.mu.Lock()
	defer t.mu.Unlock()
	for w, xw := range t.workers {
		if w.ID == id {
			t.forget(xw)
		}
	}
}

// Size implements Index.
func (t *CompressedTree) Size() int { return int(t.size.Load()) }

type cmatchScratch struct {
	out     []Match
	active  []*xworker
	next    []*xworker
	score   []uint32 // per active worker: blocks matched in the current run
	dropped []wscore
}

type wscore struct {
	w     *xworker
	score uint32
}

// FindMatches implements Index; see AppendMatches.
func (t *CompressedTree) FindMatches(local []uint64, earlyExit bool) OverlapScores {
	t.ready()
	var first *crun
	if len(local) > 0 {
		first = t.child(nil, 0, local[0])
	}
	if first == nil {
		return newScores(0) // a miss: nobody holds the first block
	}
	s := t.scratch.Get().(*cmatchScratch)
	s.out = t.appendMatches(s, s.out[:0], local, first, earlyExit)
	res := newScores(len(s.out))
	for _, m := range s.out {
		res.Scores[m.Worker] = m.Score
		res.TreeSizes[m.Worker] = m.TreeSize
	}
	t.scratch.Put(s)
	return res
}

// Match is one worker's result of matching a request.
type Match struct {
	Worker   kvevent.Worker
	Score    uint32 // leading blocks of the request it holds
	TreeSize int    // blocks it holds in the whole index
}

// AppendMatches appends to dst the match of every worker holding at least
// the request's first block (in no particular order): FindMatches without
// the maps, and without allocating. It walks the request run by run: one
// map load per run, a memequal of the request against the run's blocks,
// and one cut per active worker.
func (t *CompressedTree) AppendMatches(dst []Match, local []uint64, earlyExit bool) []Match {
	t.ready()
	if len(local) == 0 {
		return dst
	}
	first := t.child(nil, 0, local[0])
	if first == nil {
		return dst
	}
	s := t.scratch.Get().(*cmatchScratch)
	dst = t.appendMatches(s, dst, local, first, earlyExit)
	t.scratch.Put(s)
	return dst
}

// appendMatches walks local from r, the run its first block starts.
func (t *CompressedTree) appendMatches(s *cmatchScratch, dst []Match, local []uint64, r *crun, earlyExit bool) []Match {
	active, dropped := s.active[:0], s.dropped[:0]
	depth := 0
	for first := true; r != nil; first = false {
		m := commonPrefix(local[depth:], r.view())
		hs := r.holderArray()
		score := s.score[:0]
		if first {
			for i := range hs {
				if c := min(atomic.LoadUint32(&hs[i].cut), uint32(m)); c > 0 {
					active = append(active, hs[i].w)
					score = append(score, c)
				}
			}
		} else {
			score = cutsOf(score, active, hs, uint32(m))
		}
		s.score = score
		next, stop := s.next[:0], false
		if lead, runnerUp := leaders(score); earlyExit && lead >= 0 && score[lead] > runnerUp {
			// The walk the plain tree does stops once one worker is left:
			// at the runner-up's last block.
			for i, w := range active {
				if i == lead {
					dropped = append(dropped, wscore{w, uint32(depth) + runnerUp + 1})
				} else {
					dropped = append(dropped, wscore{w, uint32(depth) + score[i]})
				}
			}
			stop = true
		} else {
			for i, w := range active {
				if score[i] == uint32(m) {
					next = append(next, w)
				} else {
					dropped = append(dropped, wscore{w, uint32(depth) + score[i]})
				}
			}
		}
		s.next, active = active, next
		depth += m
		if stop || len(active) == 0 || depth == len(local) {
			break
		}
		r = t.child(r, uint32(m-1), local[depth])
	}
	for _, d := range dropped {
		dst = append(dst, Match{d.w.worker, d.score, int(d.w.size.Load())})
	}
	for _, w := range active {
		dst = append(dst, Match{w.worker, uint32(depth), int(w.size.Load())})
	}
	// Drop the references to workers, so a removed one can be collected.
	clear(active[:cap(active)])
	clear(s.next[:cap(s.next)])
	clear(dropped[:cap(dropped)])
	s.active, s.dropped = active[:0], dropped[:0]
	return dst
}

// cutsOf appends, for each active worker, how many of the run's first m
// blocks it holds (0 if it is not among hs); both are sorted by slot.
func cutsOf(dst []uint32, active []*xworker, hs []holder, m uint32) []uint32 {
	j := 0
	for _, w := range active {
		for j < len(hs) && hs[j].w.slot < w.slot {
			j++
		}
		c := uint32(0)
		if j < len(hs) && hs[j].w == w {
			c = min(atomic.LoadUint32(&hs[j].cut), m)
		}
		dst = append(dst, c)
	}
	return dst
}

// leaders returns the index of the highest score (-1 if none) and the
// second highest score (0 if fewer than two).
func leaders(score []uint32) (lead int, runnerUp uint32) {
	lead = -1
	for i, s := range score {
		switch {
		case lead < 0 || s > score[lead]:
			if lead >= 0 {
				runnerUp = score[lead]
			}
			lead = i
		case s > runnerUp:
			runnerUp = s
		}
	}
	return lead, runnerUp
}

// commonPrefix returns how many leading elements a and b share.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	a, b = a[:n], b[:n]
	if asBytes(a) == asBytes(b) {
		return n
	}
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

func asBytes(s []uint64) string {
	return unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s))
}

// Dump implements Index.
func (t *CompressedTree) Dump() []kvevent.RouterEvent { return collect(t.dumpEach) }

// dumpEach yields what Dump returns (see DumpEach).
func (t *CompressedTree) dumpEach(yield func(kvevent.RouterEvent)) {
	t.ready()
	t.mu.Lock()
	defer t.mu.Unlock()
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
		root:  0,
		yield: yield,
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
		owns: func(w kvevent.Worker, h uint64) bool {
			_, ok := t.workers[w].eng.get(h)
			return ok
		},
	}
	dumpByDepth(d, func(add func(w kvevent.Worker, h, n uint64)) {
		for w, xw := range t.workers {
			xw.eng.each(func(h, loc uint64) { add(w, h, loc) })
		}
	}, func(loc uint64) uint32 {
		r, off := t.unpack(loc)
		return startOf(r) + off
	})
}
