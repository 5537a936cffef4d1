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

// ConcurrentTree is the lock-sharded index: FindMatches runs from any number
// of goroutines while events of different workers are applied in parallel.
//
// # Layout
//
// Nodes are not linked by child pointers. A node's key is a 64-bit chain of
// the tokens hashes on its path from the root (childKey), and all nodes live
// in one xsync.Map keyed by it: a hash table of 64-byte buckets with
// lock-free reads and per-bucket write locks, so writers of unrelated nodes
// never contend and readers never lock at all. A node is a 24-byte value
// stored in the map's entry itself: its parent's key, its number of
// children, and its workers as dense worker slots (4 bytes each, not a map
// per node): one slot inline, two or more in a sorted array. Its tokens hash
// is not stored: childKey is invertible, so it is recovered from the key
// and the parent's key (Dump needs it; nothing else does).
//
// Nodes are values: xsync replaces a node's entry whenever a writer changes
// it (under the bucket lock, in Compute), and slot arrays are never modified
// once published, so a reader's lock-free load always sees one consistent
// node. A node
// left with no workers and no children is deleted and its parent's child
// count decremented (cascading), exactly as Tree unlinks nodes; so every
// ancestor of a stored node exists, which Dump relies on.
//
// Each worker (id and rank) owns a map from engine block hash to node key.
// It is touched only by the goroutine applying that worker's events.
//
// # Concurrency contract
//
//   - Apply and RemoveWorker for one worker id must come from one goroutine
//     at a time (shardpool.Pool pins every worker id to one lane); events of
//     different worker ids may be applied in parallel.
//   - FindMatches, Size and TreeSizes may run at any time, from any number of
//     goroutines. A reader takes no lock; it sees every node's worker set as
//     one consistent snapshot, but different nodes at different moments, so
//     while a writer is mid-event a reader may see some of the event's blocks
//     and not others, or a child that still holds a worker its parent no
//     longer does. A worker is scored d only if the reader saw it in each of
//     the request's first d nodes, and a worker enters a node only by storing
//     that block: so a score never exceeds the prefix the worker stored.
//   - Dump must not run concurrently with writers.
//
// Two different paths whose 64-bit chained keys collide would share a node;
// with well-mixed tokens hashes the chance is about n²/2⁶⁵ for n nodes.
type ConcurrentTree struct {
	once       sync.Once // see ready
	nodes      *xsync.Map[uint64, cnode]
	workers    *xsync.Map[kvevent.Worker, *cworker]
	slots      slotTable
	size       atomic.Int64
	collisions atomic.Uint64 // see Collisions
	scratch    sync.Pool     // *matchScratch
	groupsMu   sync.Mutex    // serialises SetGroup
	groups     atomic.Pointer[groups]
	tiered     atomic.Bool // an event of a tier other than the device's came
}

// Collisions returns how many child-count updates found no node to update:
// only two paths whose chained keys collide can make a parent vanish under
// its child. Such an update is cancelled, never applied to a node made up.
func (t *ConcurrentTree) Collisions() uint64 { return t.collisions.Load() }

// slotTable maps worker slots to workers. Slots of removed workers are
// reused; a reader resolves the slots it collected only after its walk, so
// every reuse bumps epoch, and a reader that sees the epoch move during its
// walk starts again (a reuse is rare; a query is microseconds).
type slotTable struct {
	chunks [slotChunks]atomic.Pointer[[]atomic.Pointer[cworker]]
	epoch  atomic.Uint64
	mu     sync.Mutex // guards the rest
	next   uint32     // slots handed out so far
	free   []uint32
}

// Chunk c holds 1024·2^c slots, so chunks never move and 22 cover every
// uint32 slot.
const slotChunks = 22

func slotPos(s uint32) (chunk int, i uint32) {
	x := uint64(s)/1024 + 1
	chunk = bits.Len64(x) - 1
	return chunk, uint32(uint64(s) - 1024*(1<<chunk-1))
}

func (st *slotTable) get(s uint32) *cworker {
	c, i := slotPos(s)
	return (*st.chunks[c].Load())[i].Load()
}

// take assigns a slot to cw: a freed one if any (bumping the epoch), else a
// new one.
func (st *slotTable) take(cw *cworker) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if n := len(st.free); n > 0 {
		cw.slot, st.free = st.free[n-1], st.free[:n-1]
		st.epoch.Add(1)
	} else {
		cw.slot = st.next
		st.next++
	}
	c, i := slotPos(cw.slot)
	if st.chunks[c].Load() == nil {
		chunk := make([]atomic.Pointer[cworker], 1024<<c)
		st.chunks[c].Store(&chunk)
	}
	(*st.chunks[c].Load())[i].Store(cw)
}

// release frees cw's slot, which no node holds any more. The slot keeps
// naming cw until it is taken again: a reader that saw cw in a node before
// it left still resolves the slot to cw.
func (st *slotTable) release(cw *cworker) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.free = append(st.free, cw.slot)
}

// cnode is one block, stored by value in the map's entries.
type cnode struct {
	parent   uint64    // parent's key; rootKey at the top
	children int32     // nodes whose parent this is
	single   uint32    // the one worker slot when multi is nil; noSlot if none
	multi    *[]uint32 // two or more slots, sorted; immutable once stored
}

// noSlot marks a node held by no worker.
const noSlot = ^uint32(0)

// slots returns the node's worker slots, sorted; buf backs a single slot.
func (n *cnode) slots(buf *[1]uint32) []uint32 {
	switch {
	case n.multi != nil:
		return *n.multi
	case n.single != noSlot:
		buf[0] = n.single
		return buf[:]
	}
	return nil
}

// withSlots returns n holding exactly ss (sorted; copied if more than one).
func (n cnode) withSlots(ss []uint32) cnode {
	n.single, n.multi = noSlot, nil
	switch len(ss) {
	case 0:
	case 1:
		n.single = ss[0]
	default:
		cp := slices.Clone(ss)
		n.multi = &cp
	}
	return n
}

// cworker is one cache owner. lookup and op are owned by its writer
// goroutine; the rest is safe to read concurrently.
type cworker struct {
	worker  kvevent.Worker
	slot    uint32
	size    atomic.Int64      // nodes held
	lookup  map[uint64]uint64 // engine hash -> node key
	aliases map[uint64]uint32 // node key -> engine hashes naming it beyond the first (nil: none)
	op      nodeOp
	// The op's methods as values, bound once: a closure per Compute call
	// would allocate its captured results on every block.
	joinFn, leaveFn, addChildFn, dropChildFn computeFn
}

type computeFn = func(cnode, bool) (cnode, xsync.ComputeOp)

// nodeOp carries one node update's arguments and results through xsync's
// Compute without a closure.
type nodeOp struct {
	slot            uint32
	parent          uint64 // join: the new node's parent
	created, joined bool   // join results
	deleted         bool   // leave / dropChild: the node was deleted...
	up              uint64 // ...and this was its parent
	missing         bool   // addChild / dropChild: no node to count in
}

// join adds the slot to the node, creating it if absent.
func (o *nodeOp) join(n cnode, loaded bool) (cnode, xsync.ComputeOp) {
	if !loaded {
		o.created, o.joined = true, true
		return cnode{parent: o.parent, single: o.slot}, xsync.UpdateOp
	}
	var buf [1]uint32
	ss := n.slots(&buf)
	i, found := slices.BinarySearch(ss, o.slot)
	if found {
		return n, xsync.CancelOp
	}
	o.joined = true
	return n.withSlots(slices.Insert(slices.Clip(ss), i, o.slot)), xsync.UpdateOp
}

// leave removes the slot from the node, deleting it if left empty and
// childless.
func (o *nodeOp) leave(n cnode, loaded bool) (cnode, xsync.ComputeOp) {
	if !loaded {
		return n, xsync.CancelOp
	}
	var buf [1]uint32
	ss := n.slots(&buf)
	i, found := slices.BinarySearch(ss, o.slot)
	if !found {
		return n, xsync.CancelOp
	}
	if len(ss) == 1 && n.children == 0 {
		o.deleted, o.up = true, n.parent
		return n, xsync.DeleteOp
	}
	return n.withSlots(slices.Delete(slices.Clone(ss), i, i+1)), xsync.UpdateOp
}

// dropChild decrements the node's child count, deleting it if left empty
// and childless. A missing node (only a key collision can lose one) is
// left missing: see ConcurrentTree.Collisions.
func (o *nodeOp) dropChild(n cnode, loaded bool) (cnode, xsync.ComputeOp) {
	if !loaded {
		o.missing = true
		return n, xsync.CancelOp
	}
	if n.children == 1 && n.single == noSlot && n.multi == nil {
		o.deleted, o.up = true, n.parent
		return n, xsync.DeleteOp
	}
	n.children--
	return n, xsync.UpdateOp
}

// addChild increments the node's child count. The node exists, since the
// writer creating the child holds it, unless a key collision lost it: then
// nothing is created (a zero node would claim worker slot 0).
func (o *nodeOp) addChild(n cnode, loaded bool) (cnode, xsync.ComputeOp) {
	if !loaded {
		o.missing = true
		return n, xsync.CancelOp
	}
	n.children++
	return n, xsync.UpdateOp
}

// unmix inverts childKey's finaliser.
func unmix(x uint64) uint64 {
	x ^= x >> 33
	x *= c2inv
	x ^= x >> 33
	x *= c1inv
	x ^= x >> 33
	return x
}

// The multiplicative inverses of childKey's odd constants, mod 2^64.
var c1inv, c2inv = inverse(0xFF51AFD7ED558CCD), inverse(0xC4CEB9FE1A85EC53)

func inverse(c uint64) uint64 {
	x := c // Newton's iteration doubles the correct low bits each step
	for range 6 {
		x *= 2 - c*x
	}
	return x
}

// localOf recovers a node's tokens hash from its key and its parent's key.
func localOf(key, parent uint64) uint64 { return unmix(key) ^ parent*0x9E3779B97F4A7C15 }

type matchScratch struct {
	active  []uint32
	dropped []slotScore
	depth   int
	found   []workerScore
}

type workerScore struct {
	w     *cworker
	score uint32
}

type slotScore struct {
	slot  uint32
	score uint32
}

// rootKey is the key the top-level blocks chain from; no node has it.
const rootKey uint64 = 0x243F6A8885A308D3

// childKey chains a parent key and a tokens hash: a bijective multiply-xor
// mix (the murmur3 finaliser) of parent·φ ⊕ local.
func childKey(parent, local uint64) uint64 {
	x := parent*0x9E3779B97F4A7C15 ^ local
	x ^= x >> 33
	x *= 0xFF51AFD7ED558CCD
	x ^= x >> 33
	x *= 0xC4CEB9FE1A85EC53
	x ^= x >> 33
	return x
}

// NewConcurrentTree returns an empty tree. The zero ConcurrentTree is empty
// and ready to use.
func NewConcurrentTree() *ConcurrentTree {
	t := &ConcurrentTree{}
	t.ready()
	return t
}

// ready initialises the tree on first use: a zero ConcurrentTree works, at
// the cost of one atomic load per call.
func (t *ConcurrentTree) ready() {
	t.once.Do(func() {
		t.nodes = xsync.NewMap[uint64, cnode](xsync.WithPresize(1 << 12))
		t.workers = xsync.NewMap[kvevent.Worker, *cworker]()
		t.scratch.New = func() any { return &matchScratch{} }
	})
}

var _ Index = (*ConcurrentTree)(nil)

// worker returns w's state, registering it with a slot on first sight. Only
// the goroutine applying w's events calls it.
func (t *ConcurrentTree) worker(w kvevent.Worker) *cworker {
	if cw, ok := t.workers.Load(w); ok {
		return cw
	}
	cw := &cworker{worker: w, lookup: map[uint64]uint64{}}
	t.slots.take(cw)
	cw.op.slot = cw.slot
	cw.joinFn, cw.leaveFn, cw.addChildFn, cw.dropChildFn = cw.op.join, cw.op.leave, cw.op.addChild, cw.op.dropChild
	t.workers.Store(w, cw)
	return cw
}

// forget drops everything cw holds and frees its slot and its map.
func (t *ConcurrentTree) forget(cw *cworker) {
	t.clear(cw)
	t.workers.Delete(cw.worker)
	t.slots.release(cw)
}

// ApplyBatch implements ConcurrentIndex: Apply for each event in turn (the
// tree takes no lock of its own per writer).
func (t *ConcurrentTree) ApplyBatch(evs []kvevent.RouterEvent, errs []error) {
	for i, ev := range evs {
		errs[i] = t.Apply(ev)
	}
}

// Apply implements Index. See the type's concurrency contract. An event of
// a tier other than the device's goes to the worker's holder for that tier
// (see tierHolder).
func (t *ConcurrentTree) Apply(ev kvevent.RouterEvent) error {
	t.ready()
	return applyToHolder(t, &t.tiered, ev)
}

// clearHolder forgets what holder h holds (a Cleared event).
func (t *ConcurrentTree) clearHolder(h kvevent.Worker) {
	if cw, ok := t.workers.Load(h); ok {
		t.forget(cw)
	}
}

// parentInTiers finds a parent hash among the other tiers' holders of h's
// worker: a block stored in one tier may hang under one held in another.
// Those holders are the same worker id's, so the same goroutine writes
// them (the contract): their maps are safe to read, and the parent stays
// held while the store runs.
func (t *ConcurrentTree) parentInTiers(h kvevent.Worker, parent uint64) (uint64, bool) {
	w, _ := tierHolderOf(h)
	for _, tier := range kvevent.Tiers {
		o := tierHolder(w, tier)
		if o == h {
			continue
		}
		if cw, ok := t.workers.Load(o); ok {
			if k, ok := cw.lookup[parent]; ok {
				return k, true
			}
		}
	}
	return 0, false
}

func (t *ConcurrentTree) store(w kvevent.Worker, d kvevent.Stored) error {
	if err := checkChain(w, d); err != nil {
		return err
	}
	cw, known := t.workers.Load(w)
	parent := rootKey
	if d.HasParent {
		k, ok := uint64(0), false
		if known {
			k, ok = cw.lookup[d.ParentHash]
		}
		if !ok {
			k, ok = t.parentInTiers(w, d.ParentHash)
		}
		if !ok {
			rw, _ := tierHolderOf(w)
			return fmt.Errorf("%w: worker %v, parent %#x", ErrParentNotFound, rw, d.ParentHash)
		}
		parent = k
	}
	if len(d.Blocks) == 0 {
		return nil
	}
	if !known {
		cw = t.worker(w)
	}
	others := otherTiersOf(t.workers, &t.tiered, w)
	for _, b := range d.Blocks {
		key := childKey(parent, b.TokensHash)
		old, had := cw.lookup[b.BlockHash]
		if had && old == key {
			parent = key
			continue
		}
		// Name the new node first, so that leaving old cannot delete the
		// path just walked.
		cw.lookup[b.BlockHash] = key
		if t.join(key, parent, cw) {
			cw.size.Add(1)
			t.size.Add(1)
		} else {
			if cw.aliases == nil {
				cw.aliases = map[uint64]uint32{}
			}
			cw.aliases[key]++
		}
		if had {
			t.unname(old, cw)
		}
		t.moved(others, b.BlockHash, key)
		parent = key
	}
	for _, o := range others {
		if o != nil && len(o.lookup) == 0 {
			t.forget(o)
		}
	}
	return nil
}

// moved makes the other tiers' holders leave engine hash h if it names a
// node other than key there: a hash stored under another path names a
// new block, in the new tier only (as Tree). The caller has joined key
// first, so the path stored is never cut. (A hash named at key here names
// nothing else in the other tiers: moved keeps it so.)
func (t *ConcurrentTree) moved(others [kvevent.NumTiers - 1]*cworker, h, key uint64) {
	for _, o := range others {
		if o == nil {
			continue
		}
		if old, ok := o.lookup[h]; ok && old != key {
			delete(o.lookup, h)
			t.unname(old, o)
		}
	}
}

// unname drops one engine hash of cw naming the node key (the lookup entry
// is the caller's to delete); cw leaves the node with its last alias.
func (t *ConcurrentTree) unname(key uint64, cw *cworker) {
	if !dropAlias(cw.aliases, key) {
		t.leave(key, cw)
	}
}

// join adds cw to the node key, creating it (as a child of parent) if
// needed; it reports false if cw already held the node.
func (t *ConcurrentTree) join(key, parent uint64, cw *cworker) bool {
	o := &cw.op
	o.parent, o.created, o.joined = parent, false, false
	t.nodes.Compute(key, cw.joinFn)
	if o.created && parent != rootKey {
		o.missing = false
		t.nodes.Compute(parent, cw.addChildFn)
		if o.missing {
			t.collisions.Add(1)
		}
	}
	return o.joined
}

// leave removes cw from the node key, deleting nodes left empty and
// childless up the path.
func (t *ConcurrentTree) leave(key uint64, cw *cworker) {
	cw.size.Add(-1)
	t.size.Add(-1)
	o := &cw.op
	o.deleted = false
	t.nodes.Compute(key, cw.leaveFn)
	for o.deleted && o.up != rootKey {
		o.deleted, o.missing = false, false
		t.nodes.Compute(o.up, cw.dropChildFn)
		if o.missing {
			t.collisions.Add(1)
		}
	}
}

func (t *ConcurrentTree) remove(w kvevent.Worker, hashes []uint64) error {
	cw, _ := t.workers.Load(w)
	missing := 0
	for _, h := range hashes {
		var key uint64
		ok := false
		if cw != nil {
			key, ok = cw.lookup[h]
		}
		if !ok {
			missing++
			continue
		}
		delete(cw.lookup, h)
		t.unname(key, cw)
	}
	if cw != nil && len(cw.lookup) == 0 {
		t.forget(cw)
	}
	if missing > 0 {
		return &MissingBlocksError{Worker: w, Missing: missing, Of: len(hashes)}
	}
	return nil
}

// clear makes cw leave every node, and drops its map (a Go map keeps its
// buckets when emptied).
func (t *ConcurrentTree) clear(cw *cworker) {
	for _, key := range cw.lookup {
		t.unname(key, cw)
	}
	cw.lookup, cw.aliases = map[uint64]uint64{}, nil
}

// RemoveWorker implements Index: every rank of id leaves every node and is
// forgotten; its slot is reused by a later worker (see slotTable).
func (t *ConcurrentTree) RemoveWorker(id kvevent.WorkerID) {
	t.ready()
	for _, cw := range ranksOf(t.workers, id) {
		t.forget(cw)
	}
}

// Size implements Index.
func (t *ConcurrentTree) Size() int { return int(t.size.Load()) }

// FindMatches implements Index. It walks the request's chained keys with
// lock-free map loads, intersecting the sorted slot arrays of successive
// nodes; a worker is recorded only when it drops out or the walk ends.
func (t *ConcurrentTree) FindMatches(local []uint64, earlyExit bool) OverlapScores {
	t.ready()
	s := t.scratch.Get().(*matchScratch)
	for {
		epoch := t.slots.epoch.Load()
		t.walk(s, local, earlyExit)
		// Resolve the slots before checking the epoch: if no slot was
		// reused meanwhile, each names the worker seen in the nodes.
		s.found = s.found[:0]
		for _, d := range s.dropped {
			s.found = append(s.found, workerScore{t.slots.get(d.slot), d.score})
		}
		for _, slot := range s.active {
			s.found = append(s.found, workerScore{t.slots.get(slot), uint32(s.depth)})
		}
		if t.slots.epoch.Load() == epoch {
			break
		}
	}
	res := newScores(len(s.found))
	for _, f := range s.found {
		if f.w.worker.DPRank >= 1<<tierShift {
			continue // a holder of another tier: not the device's
		}
		res.Scores[f.w.worker] = f.score
		res.TreeSizes[f.w.worker] = int(f.w.size.Load())
	}
	clear(s.found) // drop the references to workers
	t.scratch.Put(s)
	return res
}

// SetGroup implements TierIndex (safe with readers and writers).
func (t *ConcurrentTree) SetGroup(holder kvevent.Worker, members []kvevent.Worker) {
	t.groupsMu.Lock()
	defer t.groupsMu.Unlock()
	t.groups.Store(t.groups.Load().with(holder, members))
}

// FindTierMatches implements TierIndex: the walk of FindMatches, reading
// at each node which tiers' holders of each worker are in it (and its
// groups'). As FindMatches, it walks again if a slot was reused meanwhile.
func (t *ConcurrentTree) FindTierMatches(local []uint64) TierScores {
	t.ready()
	for {
		epoch := t.slots.epoch.Load()
		res := t.tierWalk(local)
		if t.slots.epoch.Load() == epoch {
			return res
		}
	}
}

func (t *ConcurrentTree) tierWalk(local []uint64) TierScores {
	g := t.groups.Load()
	tw := newTierWalk()
	key := rootKey
	var buf [1]uint32
	at := map[kvevent.Worker]kvevent.TierSet{}
	for i, h := range local {
		key = childKey(key, h)
		n, ok := t.nodes.Load(key)
		if !ok {
			break
		}
		clear(at)
		for _, slot := range n.slots(&buf) {
			if cw := t.slots.get(slot); cw != nil {
				w, tier := tierHolderOf(cw.worker)
				at[w] |= tier.Set()
			}
		}
		if i == 0 {
			for w := range at {
				tw.start(w, g)
				for _, m := range g.membersOf(w) {
					tw.start(m, g)
				}
			}
		}
		if !tw.block(i, func(w kvevent.Worker) kvevent.TierSet {
			s := at[w]
			for _, hd := range g.holdersOf(w) {
				s |= at[hd]
			}
			return s
		}) {
			break
		}
	}
	res := tw.finish()
	for w := range res.Scores {
		for _, tier := range kvevent.Tiers {
			if cw, ok := t.workers.Load(tierHolder(w, tier)); ok {
				res.TreeSizes[w] += int(cw.size.Load())
			}
		}
	}
	return res
}

// walk matches local into s.active (the slots holding all s.depth blocks
// matched) and s.dropped.
func (t *ConcurrentTree) walk(s *matchScratch, local []uint64, earlyExit bool) {
	active, dropped := s.active[:0], s.dropped[:0]
	key, depth := rootKey, 0
	var buf [1]uint32
	for i, h := range local {
		key = childKey(key, h)
		n, ok := t.nodes.Load(key)
		if !ok {
			break
		}
		ss := n.slots(&buf)
		if i == 0 {
			active = append(active, ss...)
		} else if !sameSlots(ss, active) { // the common case, nobody drops, is one memequal
			keep, j := active[:0], 0
			for _, slot := range active {
				for j < len(ss) && ss[j] < slot {
					j++
				}
				if j < len(ss) && ss[j] == slot {
					keep = append(keep, slot)
				} else {
					dropped = append(dropped, slotScore{slot, uint32(i)})
				}
			}
			active = keep
		}
		if len(active) == 0 {
			break
		}
		depth = i + 1
		if earlyExit && len(active) == 1 {
			break
		}
	}
	s.active, s.dropped, s.depth = active, dropped, depth
}

// sameSlots reports whether two slot arrays are equal, comparing their
// bytes in one go.
func sameSlots(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	ab := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(a))), 4*len(a))
	bb := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), 4*len(b))
	return string(ab) == string(bb)
}

// Dump implements Index. It must not run concurrently with writers.
func (t *ConcurrentTree) Dump() []kvevent.RouterEvent { return collect(t.dumpEach) }

// dumpEach yields what Dump returns (see DumpEach).
func (t *ConcurrentTree) dumpEach(yield func(kvevent.RouterEvent)) {
	t.ready()
	depths := map[uint64]uint32{rootKey: 0}
	var depthOf func(k uint64) uint32
	depthOf = func(k uint64) uint32 {
		if d, ok := depths[k]; ok {
			return d
		}
		n, _ := t.nodes.Load(k)
		d := depthOf(n.parent) + 1
		depths[k] = d
		return d
	}
	d := &dumper[uint64]{
		root: rootKey,
		// A holder's events are its worker's, in its tier.
		yield: func(ev kvevent.RouterEvent) {
			w, tier := tierHolderOf(ev.Worker())
			ev.Event.DPRank, ev.Tier = w.DPRank, tier
			yield(ev)
		},
		key: func(k uint64) uint64 {
			n, _ := t.nodes.Load(k)
			return localOf(k, n.parent)
		},
		parent: func(k uint64) uint64 {
			n, _ := t.nodes.Load(k)
			return n.parent
		},
		owns: func(hw kvevent.Worker, h uint64) bool { // in any tier: placeholders must not alias
			w, _ := tierHolderOf(hw)
			for _, tier := range kvevent.Tiers {
				if cw, ok := t.workers.Load(tierHolder(w, tier)); ok {
					if _, ok := cw.lookup[h]; ok {
						return true
					}
				}
			}
			return false
		},
	}
	dumpByDepth(d, func(add func(w kvevent.Worker, h, n uint64)) {
		t.workers.Range(func(w kvevent.Worker, cw *cworker) bool {
			for h, k := range cw.lookup {
				add(w, h, k)
			}
			return true
		})
	}, depthOf)
}
