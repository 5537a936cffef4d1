package radix

import (
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/kvradix/kvradix/internal/pages"
	"github.com/kvradix/kvradix/kvevent"
)

// CompressedTree is the run-compressed exact index: consecutive blocks live
// in one contiguous array, so a request is compared against a run of blocks
// with one memory access and a memequal, and a worker's claim on a run is
// one number, not one map entry per block. Writers for different workers
// proceed in parallel: each run has its own lock.
//
// The code is split by concern: this file holds the layout, the contract
// and the tables; compressed_store.go the store path, compressed_remove.go
// removal and trimming, compressed_lookup.go the readers, and
// compressed_dump.go the dump.
//
// # Layout
//
// A run is a path segment: the tokens hashes of consecutive blocks, and the
// workers holding any of them. A run hangs from a position of its parent
// run (any position, not only the last), found through one concurrent map
// keyed by a 64-bit mix of (parent run, parent position, first tokens
// hash); top-level runs hang from the root (a nil parent). The run records
// its edge and a lookup checks it, so the index stays exact even when two
// edges' keys collide: the map entry is then a chain of runs. A block is a
// (run, offset) pair for its whole life: runs are never split, so nothing
// that names a block has to be rewritten when the tree changes.
//
// Runs split where paths diverge, and only there: a Stored block extends
// its parent's run in place when the parent is the run's last block and no
// child run hangs from it (nor had other blocks there before a trim, in a
// run past 32 blocks: see below); it continues inside the run when the
// run's next block has its tokens hash; otherwise it starts (or enters) a
// child run. So the block after position p of a run is either the run's
// own next block or the first block of a child run, never both, and every
// path has exactly one place. Long shared prefixes (system prompts,
// earlier turns) become single runs; each divergence costs one map entry.
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
// atomically, once per run an event touches. Worker slots are small
// integers reused after a worker is forgotten; holders point at the worker
// itself, so a slot reused while a reader is mid-walk is never credited to
// the new worker.
//
// A run whose tail no worker holds and no child hangs from is trimmed: its
// length drops, its array stays (so a trim costs the same at any run
// length), and its version is bumped; a run that grows again over a trimmed
// tail gets a fresh array, so an array is never written below a length once
// published for it: unless the blocks stored again are the array's there
// (taken back unwritten), and, past 32 blocks, other blocks go on in a
// child run instead of a copy (walker.push, walker.extends). A run left
// with no holders and no children is deleted, and its parent settled in
// turn. So memory follows what is held: removing every worker leaves an
// empty tree.
//
// Engine block hashes name blocks through one table for every worker
// (chainTable): each block records the engine hash it was created with
// (its own hash) and claims it in the table; a worker holding the block
// names it by that hash without an entry of its own. A worker's names
// that disagree (another hash scheme, a salt, an alias, a hash the table
// gives to another block) are its own (xworker.xnames). A held block
// costs one bit; a distinct block its 8-byte tokens hash, its 8-byte own
// hash and an 8-byte slot of the table.
//
// # Concurrency contract
//
//   - Writers (Apply, ApplyBatch, RemoveWorker) may run from any number of
//     goroutines, provided the events of one worker id (and its
//     RemoveWorker) come from one goroutine at a time (shardpool.Pool pins
//     each worker id to a lane). A worker's own state (its names of its
//     own, the runs it holds and its size) is then touched by one
//     goroutine only.
//   - Writers share runs, and lock them: a store passes the leading blocks
//     its worker already holds without a lock (they are its own: nothing
//     of them changes), then walks the rest of its path hand over hand (a
//     run's children are found or created under its lock, top-level runs
//     under one of rootStripes locks chosen by the first block; the next
//     run is locked before the last is released where it is free, and
//     after, where it is not; a run found is checked to be alive once
//     locked), and updates its holder entry in each run while holding that
//     run's lock. Where the walk's first new block starts a child of a
//     position its worker holds, the child is found or made without the
//     parent's lock: heads finds or hangs it atomically, and the parent
//     counts its children by position, atomically where children hang
//     already, and under a small lock of their own (kmu) where a count
//     rises from zero, which a walk extending the run in place reads under
//     it too (mayHang). Locks are taken parent before child, never
//     the other way, and kmu last: a removal that empties a run releases
//     it, then locks it again (a top-level run under its root stripe) and
//     checks that it is still unneeded before deleting it; its parent
//     stops counting it, and is locked only if its length may now exceed
//     what is needed of it. The table of engine hashes is written without
//     locks (see chainTable): a block's claim while its run is locked, at
//     its creation, its release when it is trimmed. A hash re-pointed by
//     the event leaves its old block after the walk, so the path just
//     stored is never trimmed under it.
//   - The tree-wide tables are concurrent: run ids in a chunked array whose
//     chunks never move (runTable), workers in an xsync.Map; slot
//     allocation takes a small mutex of its own once per new worker, and a
//     run's id and serial come from its writer's stripe (held), the run
//     table's mutex taken once per eight runs made or deleted.
//   - FindMatches, AppendMatches, Size and TreeSizes may run at any time
//     from any number of goroutines; they take no lock and write nothing
//     shared. A reader sees each run's length, tokens hashes, holder array
//     and each cut as values that existed at some moment, but different
//     runs (and different cuts) at different moments: mid-event, a reader
//     may see some of an event's blocks and not others. A worker's cut only
//     ever counts blocks it held without a gap when the cut was written,
//     and a reader scores a worker only through runs whose cut it read,
//     within one version of the run (it reads the run's version before the
//     blocks and after the cuts, and reads the run again if a trim came
//     between): so a score never exceeds the prefix the worker stored.
//   - Dump waits for writers in progress and holds new ones off: a writer
//     holds its worker id's stripe (one of writerStripes mutexes, each with
//     its share of the size counter, on a cache line of its own) for an
//     event, or for a batch's consecutive events of one stripe; Dump takes
//     every stripe. Lanes of a pool own disjoint stripes when their number
//     divides writerStripes, so no line of the tree's is written by two
//     lanes per event.
type CompressedTree struct {
	once     sync.Once                 // see ready
	heads    *xsync.Map[uint64, *crun] // edgeKey -> runs hanging there (a chain on collisions)
	edgeMask uint64                    // ^0; tests narrow it to force collisions
	runLimit uint32                    // maxRunLen; tests lower it
	// copyLimit is the longest run copied for a block stored past the
	// length it was trimmed to (see walker.extends): copyLimitLen; 0 in
	// tests, to make child runs there.
	copyLimit uint32
	scratch   sync.Pool // *cmatchScratch
	runs      runTable
	chain     chainTable // engine hash -> the block it is the own hash of
	workers   *xsync.Map[kvevent.Worker, *xworker]
	stripes   [writerStripes]writerStripe
	rootMu    [rootStripes]paddedMutex

	slotMu   sync.Mutex // guards freeSlot and slots
	freeSlot []uint32
	slots    uint32 // slots handed out so far

	groupsMu sync.Mutex // serialises SetGroup
	groups   atomic.Pointer[groups]
	tiered   atomic.Bool // an event of a tier other than the device's came

	// hook, nil but in tests, is called at the points a hookPoint names,
	// where another goroutine's events may come between two steps of a
	// reader or a removal: tests replay such schedules through it.
	hook func(hookPoint)
}

// hookPoint names a place in the code where a test may interleave events.
type hookPoint uint8

const (
	// hookScored: a lock-free reader has read a run's blocks and cuts and
	// not yet looked up the run the request goes on in.
	hookScored hookPoint = iota
	// hookTierStep: a tier reader has unlocked a run and not yet locked
	// the next.
	hookTierStep
	// hookSettled: a removal found nothing of a run needed and unlocked it,
	// and has not yet taken its parent's lock to delete it.
	hookSettled
	// hookDescend: a store found the run it goes on in locked, released
	// the parent's lock (or the root stripe) and has not yet waited for it.
	hookDescend
	// hookBranch: a store found no child where its next block may start
	// one, under a position its worker holds, without the run's lock, and
	// has not yet counted one (walker.branch).
	hookBranch
	// hookLeave: a store has walked a run, locked, and not yet published
	// the blocks it appended to it (walker.leave).
	hookLeave
	// hookFirstKid: a store has found, under a run's kids lock, that a
	// first child belongs at a position, and not yet counted it (mayHang).
	hookFirstKid
)

// at calls the test hook, if any.
func (t *CompressedTree) at(p hookPoint) {
	if t.hook != nil {
		t.hook(p)
	}
}

// rootStripes is how many locks guard the creation and deletion of
// top-level runs, striped by the first block's tokens hash: a power of two
// well above the writers a machine runs at once.
const (
	rootStripeBits = 6
	rootStripes    = 1 << rootStripeBits
)

// paddedMutex keeps each stripe on a cache line of its own.
type paddedMutex struct {
	sync.Mutex
	_ [64 - 8]byte
}

// writerStripes is how many stripes writers take by worker id: a power of
// two, so that any pool of a power-of-two lanes up to it gives each lane its
// own.
const writerStripes = 16

// writerStripe is what the writers of one stripe share: the lock Dump takes
// to hold them off, their share of the size, the run ids they have to hand
// (see runTable), the runs they made (for serials), a store's scratch, the
// worker an event named last and where a removal left its worker, all
// theirs while they hold the lock. The scratch and the last worker spare
// each event the workers map's hash of its worker (a struct, hashed by
// maphash.Comparable) and a sync.Pool's get and put: 12-17% of a one-block
// store (results/stripe-holder.txt); left spares an engine's next removal
// in a tail-first eviction (vLLM sends one hash an event) the table's
// lookup (see leaver.resume). Two cache lines.
type writerStripe struct {
	mu      sync.Mutex
	size    atomic.Int64
	ids     []uint32
	made    uint64
	scratch *storeScratch // nil until the stripe's first store
	last    *xworker      // in workers; nil once forgotten (forget)
	left    leftAt
	_       [128 - 88]byte
}

// serial returns a serial for a run a writer of worker id makes (its
// stripe held): unique for the tree's life, without a counter every
// writer's runs write.
func (t *CompressedTree) serial(id kvevent.WorkerID) uint64 {
	st := t.stripe(id)
	st.made++
	return st.made*writerStripes + uint64(id)%writerStripes
}

func (t *CompressedTree) stripe(id kvevent.WorkerID) *writerStripe {
	return &t.stripes[uint64(id)%writerStripes]
}

// holder returns w's state, nil if it holds nothing, for a writer holding
// st, w's stripe: the stripe's last, or the workers map's (then the last).
func (t *CompressedTree) holder(st *writerStripe, w kvevent.Worker) *xworker {
	if xw := st.last; xw != nil && xw.worker == w {
		return xw
	}
	xw, _ := t.workers.Load(w)
	if xw != nil {
		st.last = xw
	}
	return xw
}

// addSize counts n more pairs held by xw.
func (t *CompressedTree) addSize(xw *xworker, n int) {
	xw.size.Add(int64(n))
	t.stripe(xw.worker.ID).size.Add(int64(n))
}

// rootLock returns the stripe guarding top-level runs starting with key.
func (t *CompressedTree) rootLock(key uint64) *sync.Mutex {
	return &t.rootMu[key*0x9E3779B97F4A7C15>>(64-rootStripeBits)].Mutex
}

// crun is one run of blocks.
type crun struct {
	// Read by lookups (see view). keys is the backing array (len =
	// capacity); only its first n entries are blocks. An array is never
	// written below a length published for it: a run regrown over a
	// trimmed tail gets a fresh one. ver counts trims.
	keys    atomic.Pointer[[]uint64]
	n       atomic.Uint32
	ver     atomic.Uint32
	holders atomic.Pointer[[]holder] // sorted by slot; immutable but for cuts
	collide atomic.Pointer[crun]     // the next run whose edge has the same key

	// Where the run hangs; immutable.
	parent    *crun // nil: the root
	parentOff uint32
	first     uint64 // the first block's tokens hash
	serial    uint64 // unique for the tree's life, unlike id

	// eng holds each position's own engine hash (the one the block was
	// created with; len = cap of keys), written under mu like keys: a
	// position before the length that covers it is published, and never
	// again in that array. The table's lookups read it without the lock,
	// at a position below a length loaded after the array: written before
	// that length was published, and not since (an array replaced since
	// was written before its successor's lengths were published).
	eng atomic.Pointer[[]uint64]

	// Writer-side, under mu.
	mu      sync.Mutex
	claimed []uint64 // positions whose own hash names them in the table
	id      uint32
	hw      uint32 // the longest length published for the current array
	dead    bool   // deleted: unreachable, and never to be written again
	lone    bool   // its array last grew for a lone block, a decode step's (walker.extends)

	// Where child runs hang: a store makes a child of a position its
	// worker holds without the run's lock (walker.branch), and a child is
	// deleted without it (drop), so that siblings made and deleted under
	// one shared run do not queue on its lock. kids counts a child before
	// it can be found (hang) and until it is dead, by position: one more
	// child where children hang already, and one less, are atomic adds to
	// the position's count; the first child of a position (a count from
	// zero), a new position, and the look of a walk about to extend the
	// run in place (walker.step) take kmu, a lock taken alone or under mu,
	// never the other way round (see CompressedTree.mayHang).
	kmu  sync.Mutex
	kids atomic.Pointer[kidSet]
}

// kidSet is where a run's children hang: a count for each position, by
// position. A set is immutable but for its counts: a new position is a
// new set (under kmu), with the counts of the old one's positions (the
// same kidCounts) but those at zero, which a set keeps till then.
type kidSet []*kidCount

// kidCount counts the child runs hanging from one position.
type kidCount struct {
	off uint32
	n   atomic.Int32
}

// holder is a worker's claim on a run. Readers read w and cut (atomically);
// the rest is the writers', under the run's lock.
type holder struct {
	w    *xworker
	cut  uint32 // leading positions held without a gap; atomic
	top  uint32 // highest position held + 1; written atomically, for extent without the lock
	held uint32 // positions held
	bits []uint64
}

func (h *holder) has(off uint32) bool { return hasBit(h.bits, off) }

// xworker is one cache owner (a worker id and rank). Its maps are touched
// only by the goroutine applying its events.
type xworker struct {
	worker kvevent.Worker
	slot   uint32
	size   atomic.Int64       // blocks held
	runs   map[*crun]struct{} // the runs it holds blocks of
	xnames map[uint64]uint64  // its names of its own: engine hash -> location (nil: none)
	xcount map[uint64]uint32  // location -> how many xnames name it, | noOwn (nil: none)
	tips   *tipCache          // where its last stores ended (nil until its first)
}

// noOwn marks, in xcount, a block the worker holds only by names of its
// own: the block's own hash does not name it for the worker.
const noOwn = 1 << 31

// xname returns xw's name of its own for engine hash h, if any. A worker
// has none but where an engine's hashes disagree with the blocks' own
// (nil maps), and a map access is a call even on a nil map: on the
// field's corpus, two a stored block and two a removed one, for maps
// that were always nil (results/nil-maps.txt).
func (xw *xworker) xname(h uint64) (uint64, bool) {
	if xw.xnames == nil {
		return 0, false
	}
	loc, ok := xw.xnames[h]
	return loc, ok
}

// plain reports whether xw has no names of its own, so that every block
// it holds it names by the block's own hash, which the block claimed
// (walker.name). xcount counts a block's names of its own until the block
// is left, even where a store or a removal has just deleted the names
// (and a store keeps them in storeScratch.old meanwhile): so it is empty
// only where xnames is and no event is moving one of them.
func (xw *xworker) plain() bool { return len(xw.xcount) == 0 }

// count returns how many of xw's names of its own name the block at loc,
// with noOwn (see xcount).
func (xw *xworker) count(loc uint64) uint32 {
	if xw.xcount == nil {
		return 0
	}
	return xw.xcount[loc]
}

// uncount forgets the block at loc's count (see count).
func (xw *xworker) uncount(loc uint64) {
	if xw.xcount != nil {
		delete(xw.xcount, loc)
	}
}

// A location packs a run id (high half, >= 1) and an offset; 0 is the root.
func pack(r *crun, off uint32) uint64 { return uint64(r.id)<<32 | uint64(off) }

// unpack returns the run and offset of a location (the run nil if none
// has its id; a location the caller's worker holds is live).
func (t *CompressedTree) unpack(loc uint64) (*crun, uint32) {
	return t.runs.get(uint32(loc >> 32)), uint32(loc)
}

// ownHash returns the own engine hash of the block at loc, for the
// table's lookups: false if no run has loc's id or the run is shorter.
// It loads the array before the length (see crun.eng).
func (t *CompressedTree) ownHash(loc uint64) (uint64, bool) {
	r, off := t.unpack(loc)
	if r == nil {
		return 0, false
	}
	eng := r.eng.Load()
	if eng == nil || off >= r.n.Load() || int(off) >= len(*eng) {
		return 0, false
	}
	return (*eng)[off], true
}

// ownHashesAhead loads, for a batch of locations (at most moveBatch: see
// chainTable.move), what ownHash will read for each (its run, the run's
// array, the hash), a step at a time across the batch, so that their
// cache misses overlap instead of following one another. The loads are
// atomic, so not optimised away.
func (t *CompressedTree) ownHashesAhead(locs []uint64) {
	var engs [moveBatch]*[]uint64
	for i, loc := range locs {
		if r, _ := t.unpack(loc); r != nil {
			engs[i] = r.eng.Load()
		}
	}
	for i, loc := range locs {
		if eng := engs[i]; eng != nil && int(uint32(loc)) < len(*eng) {
			atomic.LoadUint64(&(*eng)[uint32(loc)])
		}
	}
}

// runTable maps run ids to runs: chunks of runChunk slots that never move
// once allocated, under a directory replaced (copied) when it grows, so
// that a writer resolves an id with two loads and no lock while another
// writer creates runs.
//
// Ids are handed out from a writer stripe's own spares (writerStripe.ids,
// under the stripe's lock, which its writers hold): a run made and deleted
// takes no lock of the table's, and its slot is on a cache line of its
// stripe's (ids come fresh idBatch at a time, a line of slots). Under mu,
// a stripe out of ids takes idBatch from the table's free ids, or fresh
// ones, and one holding 2*idBatch gives idBatch back: so at most
// 2*idBatch*writerStripes ids are spare. Two writers making and deleting
// runs beside each other took one lock and wrote slots on one line for
// each: at -cpu 2 BenchmarkApplyParallel ran 5-26% slower
// (results/run-ids.txt).
type runTable struct {
	dir  atomic.Pointer[[]*runChunk]
	mu   sync.Mutex // guards free, next and the directory's growth
	free []uint32
	next uint32 // ids handed out so far; id 0 is never used
}

// idBatch is how many ids a writer stripe takes or gives back at once: a
// cache line of slots.
const idBatch = 8

const runChunkBits = 12

type runChunk [1 << runChunkBits]atomic.Pointer[crun]

func (rt *runTable) get(id uint32) *crun {
	return (*rt.dir.Load())[id>>runChunkBits][id&(1<<runChunkBits-1)].Load()
}

// add gives r an id from the spare ids ids (a writer stripe's, locked) and
// registers it.
func (rt *runTable) add(r *crun, ids *[]uint32) {
	if len(*ids) == 0 {
		rt.refill(ids)
	}
	n := len(*ids)
	r.id, *ids = (*ids)[n-1], (*ids)[:n-1]
	(*rt.dir.Load())[r.id>>runChunkBits][r.id&(1<<runChunkBits-1)].Store(r)
}

// refill puts idBatch ids in ids (empty): freed ones, else fresh ones up
// to a multiple of idBatch (a line of slots), growing the directory.
func (rt *runTable) refill(ids *[]uint32) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if n := len(rt.free); n > 0 {
		k := max(n-idBatch, 0)
		*ids, rt.free = append(*ids, rt.free[k:]...), rt.free[:k]
		return
	}
	if rt.next == 0 {
		rt.next = 1
	}
	for {
		*ids = append(*ids, rt.next)
		rt.next++
		if rt.next%idBatch == 0 {
			break
		}
	}
	var dir []*runChunk
	if p := rt.dir.Load(); p != nil {
		dir = *p
	}
	if c := int((rt.next - 1) >> runChunkBits); c == len(dir) {
		grown := append(dir[:len(dir):len(dir)], new(runChunk))
		rt.dir.Store(&grown)
	}
}

// del frees the id of a deleted run into the spare ids ids (a writer
// stripe's, locked), giving idBatch back to the table if they are many.
func (rt *runTable) del(id uint32, ids *[]uint32) {
	(*rt.dir.Load())[id>>runChunkBits][id&(1<<runChunkBits-1)].Store(nil)
	*ids = append(*ids, id)
	if n := len(*ids); n >= 2*idBatch {
		rt.mu.Lock()
		rt.free = append(rt.free, (*ids)[n-idBatch:]...)
		rt.mu.Unlock()
		*ids = (*ids)[:n-idBatch]
	}
}

// each calls fn for every live run; no writer may run.
func (rt *runTable) each(fn func(r *crun)) {
	for id := uint32(1); id < rt.next; id++ {
		if r := rt.get(id); r != nil {
			fn(r)
		}
	}
}

// NewCompressedTree returns an empty tree.
// The zero CompressedTree is empty and ready to use.
//
// A tree grown as it fills (this one, or the zero one) makes resident
// ahead of time the heap its blocks are about to take, each time its
// table of engine hashes doubles past 92 segments (about 370,000 distinct
// blocks): in a goroutine of its own, one at a time in the process, not
// where the heap's free pages are resident already nor past the soft
// memory limit (runtime/debug.SetMemoryLimit), each warm ending in a
// collection. Its size doubles with the table's, up to 512 MiB.
func NewCompressedTree() *CompressedTree {
	t := &CompressedTree{}
	t.ready()
	return t
}

// NewCompressedTreeSized returns an empty tree whose table of engine hashes
// is sized for blocks distinct blocks (the engines' num_gpu_blocks summed,
// say): filling it that far splits no segment of the table, so a growing
// index moves no entry and faults in no page on the way. The table's
// memory, 8 bytes a slot at a load of 0.7, is taken and made resident
// here (so the stores that fill it take no page fault): 512 MiB at most, past
// which it grows as an unsized one. Entries released merge segments left
// empty; the reserved memory itself is returned when the last reserved
// segment is gone. It also makes resident 16 bytes of Go's heap a block
// (up to 512 MiB, from 8 MiB: pages.Warm, which runs a collection), for
// the runs' arrays to grow into: on a virtual machine a first touch of a
// page costs microseconds, and the trace stored into a fresh sized tree
// took a third less time a block, with one writer or two, when its
// stores faulted in no page (results/README.md). For blocks of 0 or less it
// is NewCompressedTree: a tree grown as it fills.
func NewCompressedTreeSized(blocks int) *CompressedTree {
	t := NewCompressedTree()
	if blocks <= 0 {
		return t
	}
	t.chain.reserve(blocks)
	if n := warmFor(blocks); n >= minWarm {
		pages.Warm(n)
	}
	return t
}

// Reserve sizes t's table of engine hashes for blocks distinct blocks, as
// NewCompressedTreeSized does, where it is sized for fewer: for a service
// that learns the engines' pools as they register (Dynamo's
// total_kv_blocks) rather than when it makes the index. The entries of the
// blocks t holds move into the new table, each one's engine hash read for
// its place there, a batch at a time, while stores and removals wait (it
// takes every writer stripe; lookups go on): about 0.04 s for a million
// blocks here (BenchmarkCompressedReserve), the new table made resident
// before they wait. The heap the runs grow into is then warmed in the
// background (pages.WarmAhead), not by the caller. It reports whether it
// resized: not where the table is as large already.
func (t *CompressedTree) Reserve(blocks int) bool {
	t.ready()
	if blocks <= 0 || !t.reserve(blocks) {
		return false
	}
	if n := warmFor(blocks); n >= minWarm {
		pages.WarmAhead(n)
	}
	return true
}

// reserve resizes the table, its new directory made resident before the
// writers wait for the entries to move.
func (t *CompressedTree) reserve(blocks int) bool {
	d := t.newReserved(blocks)
	return d != nil && t.adopt(d)
}

// newReserved returns the directory, resident, that reserve moves the
// table into for blocks, or nil where it would not resize the table.
func (t *CompressedTree) newReserved(blocks int) *chainDir {
	depth := reserveDepth(blocks)
	if !t.chain.takes(depth) {
		return nil
	}
	return reservedDir(depth)
}

// adopt moves the table into d (newReserved) while every writer waits.
func (t *CompressedTree) adopt(d *chainDir) bool {
	defer t.lockWriters()()
	return t.chain.adopt(d)
}

// lockWriters takes every writer stripe, so that no store or removal runs,
// and returns the function that releases them.
func (t *CompressedTree) lockWriters() (unlock func()) {
	for i := range t.stripes {
		t.stripes[i].mu.Lock()
	}
	return func() {
		for i := range t.stripes {
			t.stripes[i].mu.Unlock()
		}
	}
}

// warmFor is the heap a tree sized for blocks blocks warms for its runs.
func warmFor(blocks int) int { return min(blocks, maxWarmBlocks) * warmBytesPerBlock }

// warmBytesPerBlock is the heap NewCompressedTreeSized makes resident for
// each block it is sized for: a block's tokens and engine hashes in its
// run's arrays. maxWarmBlocks caps it at maxWarm, 512 MiB, as the table
// is capped; under minWarm it warms none (the collection warming takes
// costs more than the faults it saves).
const (
	warmBytesPerBlock = 16
	maxWarm           = 512 << 20
	maxWarmBlocks     = maxWarm / warmBytesPerBlock
	minWarm           = 8 << 20
)

// warmAhead makes resident in the background (pages.WarmAhead) the heap a
// tree's blocks take until its table of engine hashes doubles again: the
// table's directory has just doubled, to segs segments, and about as many
// entries again as they can hold will come before the next. A grown
// tree's stores otherwise fault in the fresh heap its runs grow into,
// over a quarter of the trace's fresh store on our VM; warmed so at each
// doubling, the store took about a fifth less time, one writer
// (results/README.md). Under minWarm, the first 92 segments, it warms
// none.
func warmAhead(segs int) {
	if n := min(segs*aheadBytesPerSeg, maxWarm); n >= minWarm {
		pages.WarmAhead(n)
	}
}

// aheadBytesPerSeg is the heap warmAhead warms a segment: 32 bytes an
// entry a full-size segment holds at reserveLoad. A stored block's run
// takes 16 bytes of arrays that double as they grow, and its table entry
// 9 to 16 (8-byte slots at a load of 7/8 to 0.5): about 32 bytes of new
// heap an entry (16 took 5% off the fresh store, 48 and 64 more memory
// and less time off).
const aheadBytesPerSeg = segSlots * 7 / 10 * 32

// ready initialises the tree on first use: a zero CompressedTree works, at
// the cost of one atomic load per call.
func (t *CompressedTree) ready() {
	t.once.Do(func() {
		t.heads = xsync.NewMap[uint64, *crun]()
		t.workers = xsync.NewMap[kvevent.Worker, *xworker]()
		t.edgeMask, t.runLimit, t.copyLimit = ^uint64(0), maxRunLen, copyLimitLen
		t.chain.init(t.ownHash)
		t.chain.doubled, t.chain.keysAhead = warmAhead, t.ownHashesAhead
		t.scratch.New = func() any { return &cmatchScratch{} }
	})
}

// Apply implements Index. See the type's concurrency contract.
func (t *CompressedTree) Apply(ev kvevent.RouterEvent) error {
	t.ready()
	st := t.stripe(ev.WorkerID)
	st.mu.Lock()
	defer st.mu.Unlock()
	return t.apply(ev)
}

// ApplyBatch implements ConcurrentIndex: the events in order, errs[i]
// Apply's answer for evs[i], taking each writer stripe once for a run of
// consecutive events in it.
func (t *CompressedTree) ApplyBatch(evs []kvevent.RouterEvent, errs []error) {
	t.ready()
	var held *writerStripe
	peeked := 0
	for i, ev := range evs {
		if i == peeked {
			peeked = t.peekLookups(evs, i)
		}
		if st := t.stripe(ev.WorkerID); st != held {
			if held != nil {
				held.mu.Unlock()
			}
			st.mu.Lock()
			held = st
		}
		errs[i] = t.apply(ev)
	}
	if held != nil {
		held.mu.Unlock()
	}
}

// peekLookups prefetches the table's first lookup of each of the next
// peekAhead events from evs[from]: a store's parent, a removal's first
// hash (vLLM sends one BlockRemoved a hash; an engine evicting a sequence
// from its tail names, after the first, hashes that follow it, read from
// the run). The lookups are one an event, a miss after another; asked for
// together, their misses overlap. It returns where it stopped.
func (t *CompressedTree) peekLookups(evs []kvevent.RouterEvent, from int) int {
	to := min(from+peekAhead, len(evs))
	var hs [peekAhead]uint64
	n := 0
	for _, ev := range evs[from:to] {
		switch d := ev.Event.Data.(type) {
		case kvevent.Stored:
			if d.HasParent {
				hs[n] = d.ParentHash
				n++
			}
		case kvevent.Removed:
			if len(d.BlockHashes) > 0 {
				hs[n] = d.BlockHashes[0]
				n++
			}
		}
	}
	if n > 1 {
		t.chain.prefetch(hs[:n])
	}
	return to
}

// apply applies one event; an event of a tier other than the device's goes
// to the worker's holder for that tier (see tierHolder).
func (t *CompressedTree) apply(ev kvevent.RouterEvent) error {
	return applyToHolder(t, &t.tiered, ev)
}

// clearHolder forgets what holder h holds (a Cleared event).
func (t *CompressedTree) clearHolder(h kvevent.Worker) {
	if xw, _ := t.workers.Load(h); xw != nil {
		t.forget(xw)
	}
}

// worker returns w's state, registering it on first sight with the slot
// freed last, or a new one.
func (t *CompressedTree) worker(w kvevent.Worker) *xworker {
	if xw, _ := t.workers.Load(w); xw != nil {
		return xw
	}
	xw := &xworker{worker: w}
	t.slotMu.Lock()
	if n := len(t.freeSlot); n > 0 {
		xw.slot, t.freeSlot = t.freeSlot[n-1], t.freeSlot[:n-1]
	} else {
		xw.slot = t.slots
		t.slots++
	}
	t.slotMu.Unlock()
	t.workers.Store(w, xw)
	return xw
}

// RemoveWorker implements Index: every rank of id leaves every block and
// is forgotten.
func (t *CompressedTree) RemoveWorker(id kvevent.WorkerID) {
	t.ready()
	st := t.stripe(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, xw := range ranksOf(t.workers, id) {
		t.forget(xw)
	}
}

// Size implements Index.
func (t *CompressedTree) Size() int {
	var n int64
	for i := range t.stripes {
		n += t.stripes[i].size.Load()
	}
	return int(n)
}
