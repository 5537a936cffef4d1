package shardpool

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// ApproxPolicy is how an Approx index forgets the blocks it predicted.
type ApproxPolicy uint8

const (
	// ApproxLRU models each rank's KV pool of a known number of blocks (the
	// engine's total_kv_blocks), as vLLM manages it: a routed request
	// leases its blocks (those the rank holds are reused, the others are
	// made), and the blocks its partial prompt block and output take, until
	// it completes. While a rank's blocks exceed its capacity, released
	// blocks are evicted, the oldest release first and the deepest block
	// first within one release; a leased block never is. vLLM may hold two
	// copies of a block that was computed again after a miss; with chain
	// hashes a block after a miss is one the rank lacks, so the model needs
	// no copies: a block is held or not.
	ApproxLRU ApproxPolicy = iota + 1
	// ApproxTTL keeps every routed block for a fixed time after its latest
	// routing, whatever the engine's capacity; completions do not matter.
	ApproxTTL
)

// String returns "lru" or "ttl".
func (p ApproxPolicy) String() string {
	switch p {
	case ApproxLRU:
		return "lru"
	case ApproxTTL:
		return "ttl"
	}
	return fmt.Sprintf("policy(%d)", int(p))
}

// DefaultApproxTTL is ApproxTTL's default lifetime, Dynamo's
// (--router-ttl-secs, 120 s).
const DefaultApproxTTL = 120 * time.Second

// ApproxConfig configures an Approx index.
type ApproxConfig struct {
	Policy    ApproxPolicy
	BlockSize int // tokens per block of the requests predicted (> 0)
	// Capacity is every rank's KV blocks (ApproxLRU; > 0) unless
	// SetCapacity says otherwise for it.
	Capacity int
	// TTL is how long a block stays after its latest routing (ApproxTTL;
	// 0: DefaultApproxTTL).
	TTL time.Duration
	// Now is the clock lifetimes are measured on (nil: time.Now); a replay
	// passes its virtual one. A clock that goes back is read as standing.
	Now func() time.Time
}

// ErrNotRead is what an Approx index's observer hears of every event it is
// sent: it predicts from routing decisions and reads no events.
var ErrNotRead = errors.New("shardpool: an approximate index reads no KV events")

// Approx is an Indexer fed by routing decisions instead of KV events: it
// predicts what each (worker, rank) caches from the requests routed to it
// (Predict) and their completions (Release), under an ApproxPolicy, for
// engines that publish no events or whose events are late or lost.
//
// Its predictions are kept as Stored and Removed events of a
// radix.CompressedTree, so a prediction is matched exactly as an event
// stream would be. Writers (Predict, Release, SetCapacity, Forget,
// RemoveWorker) are serialised by a mutex; FindMatches reads the tree
// without it, except that an ApproxTTL index first drops what has expired
// when an expiry is due. All methods are safe for concurrent use.
type Approx struct {
	cfg    ApproxConfig
	ttl    time.Duration
	h      *hasher
	tree   *radix.CompressedTree
	closed atomic.Bool
	c      counters
	unread atomic.Uint64
	// due is when the first queued expiry is (ApproxTTL; MaxInt64: none),
	// so that a lookup takes the lock only when something has expired.
	due atomic.Int64

	mu      sync.Mutex
	epoch   time.Time // the clock's first reading: times are kept as offsets from it
	last    time.Duration
	ranks   map[kvevent.Worker]*approxRank
	leases  map[uuid.UUID]approxLease
	expiry  []approxExpiry // ApproxTTL: a request's blocks and their expiry, in expiry order
	head    int            // expiry[:head] are done
	touched []*approxRank  // ranks with removals to apply
	stored  []kvevent.StoredBlock
	st      ApproxStats
}

// ApproxStats are an Approx index's own counters.
type ApproxStats struct {
	Predictions uint64 // requests predicted
	Releases    uint64 // leases released
	HitBlocks   uint64 // predicted blocks: the leading ones the rank held already
	NewBlocks   uint64 // predicted blocks the rank did not hold
	Evicted     uint64 // blocks evicted for capacity (ApproxLRU)
	Expired     uint64 // blocks expired (ApproxTTL)
	Blocks      int    // blocks held now, in every rank
	Leased      int    // requests holding a lease now
}

// approxRank is one (worker, rank)'s predicted pool. Its blocks live in
// chunks and link by index, so that neither they nor the map holds a
// pointer for the collector to scan, and growing never copies them.
type approxRank struct {
	w        kvevent.Worker
	capacity int
	used     int              // blocks held and leased private blocks
	held     map[uint64]int32 // a held block's index in blocks
	// blocks are chunks of 2^chunkBits; block 0 is the sentinel of the
	// free list of released blocks: its next is the oldest (ApproxLRU).
	blocks [][]approxBlock
	made   int32    // blocks ever made: the next new index
	spare  []int32  // indexes of blocks dropped, for reuse
	gone   []uint64 // hashes dropped, not yet applied
}

// chunkBits sizes a rank's chunks of blocks.
const chunkBits = 10

// block returns block i of the rank.
func (r *approxRank) block(i int32) *approxBlock { return &r.blocks[i>>chunkBits][i&(1<<chunkBits-1)] }

// approxBlock is a block in a rank's pool.
type approxBlock struct {
	hash       uint64
	expires    time.Duration // ApproxTTL
	leases     int32         // ApproxLRU; a held block with none is on the free list
	prev, next int32         // the free list
}

// approxLease is what a routed request holds until Release.
type approxLease struct {
	rank    *approxRank
	blocks  []int32
	private int
}

// approxExpiry is when a request's blocks expire (ApproxTTL), unless a
// later request refreshed them.
type approxExpiry struct {
	rank    *approxRank
	seq     []uint64
	expires time.Duration
}

var _ Indexer = (*Approx)(nil)

// NewApprox returns an empty approximate index, or the configuration's
// first error.
func NewApprox(cfg ApproxConfig) (*Approx, error) {
	switch {
	case cfg.Policy != ApproxLRU && cfg.Policy != ApproxTTL:
		return nil, fmt.Errorf("shardpool: approximate policy %v, want lru or ttl", cfg.Policy)
	case cfg.BlockSize <= 0:
		return nil, fmt.Errorf("shardpool: block size %d, want > 0", cfg.BlockSize)
	case cfg.Policy == ApproxLRU && cfg.Capacity <= 0:
		return nil, fmt.Errorf("shardpool: lru capacity %d blocks, want > 0", cfg.Capacity)
	case cfg.TTL < 0:
		return nil, fmt.Errorf("shardpool: ttl %v, want >= 0", cfg.TTL)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Approx{cfg: cfg, ttl: cfg.TTL, h: newHasher(cfg.BlockSize), tree: radix.NewCompressedTree(),
		epoch: cfg.Now(), ranks: make(map[kvevent.Worker]*approxRank), leases: make(map[uuid.UUID]approxLease)}
	if a.ttl == 0 {
		a.ttl = DefaultApproxTTL
	}
	a.due.Store(math.MaxInt64)
	return a, nil
}

// Policy returns the index's policy.
func (a *Approx) Policy() ApproxPolicy { return a.cfg.Policy }

// now reads the clock as an offset from the first reading, never going
// back. Callers hold a.mu.
func (a *Approx) now() time.Duration {
	a.last = max(a.last, a.cfg.Now().Sub(a.epoch))
	return a.last
}

// rank returns w's pool, made on first use. Callers hold a.mu.
func (a *Approx) rank(w kvevent.Worker) *approxRank {
	r := a.ranks[w]
	if r == nil {
		r = &approxRank{w: w, capacity: a.cfg.Capacity, held: make(map[uint64]int32, min(a.cfg.Capacity, 1<<12)), made: 1}
		r.blocks = [][]approxBlock{make([]approxBlock, 1<<chunkBits)} // block 0: the free list's sentinel
		a.ranks[w] = r
	}
	return r
}

// Predict records that request id was routed to w: local are its complete
// prompt blocks' local hashes and seq their sequence hashes
// (hashing.SequenceHashes of local, which the index relies on), extra the blocks it takes beyond them (its partial prompt
// block and its output; ApproxLRU counts them against the capacity until
// Release). An id already leased is an error.
func (a *Approx) Predict(id uuid.UUID, w kvevent.Worker, local, seq []uint64, extra int) error {
	if len(local) != len(seq) || extra < 0 {
		return fmt.Errorf("shardpool: prediction %v: %d local hashes, %d sequence hashes, %d extra blocks", id, len(local), len(seq), extra)
	}
	if a.closed.Load() {
		return ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, dup := a.leases[id]; dup {
		return fmt.Errorf("shardpool: prediction %v: request already predicted", id)
	}
	now := a.now()
	a.expire(now)
	r := a.rank(w)
	a.st.Predictions++
	if a.cfg.Policy == ApproxTTL {
		t := now + a.ttl
		a.place(r, local, seq, func(_ int, b *approxBlock, _ int32, _ bool) { b.expires = t })
		a.expiry = append(a.expiry, approxExpiry{rank: r, seq: slices.Clone(seq), expires: t})
		a.due.Store(int64(a.expiry[a.head].expires))
		return nil
	}
	l := approxLease{rank: r, blocks: make([]int32, len(seq)), private: extra}
	a.place(r, local, seq, func(j int, b *approxBlock, i int32, made bool) {
		if !made && b.leases == 0 {
			r.unlink(i) // released: leased again
		}
		b.leases++
		l.blocks[j] = i
	})
	r.used += extra
	a.leases[id] = l
	a.evict(r)
	return nil
}

// place hands each of seq's blocks on r to took: the leading ones r
// holds, then the rest, made (and said so) and stored in the tree in one
// run under the last one held.
//
// A rank's blocks are closed under parents: every lease and refresh of a
// block is one of its parent too, and a parent is released (or expires)
// with its child or later, and goes after it. So past the first block the
// rank lacks it lacks every one (seq being sequence hashes), and they are
// made without looking them up.
func (a *Approx) place(r *approxRank, local, seq []uint64, took func(j int, b *approxBlock, i int32, made bool)) {
	hits := 0
	for ; hits < len(seq); hits++ {
		i, ok := r.held[seq[hits]]
		if !ok {
			break
		}
		took(hits, r.block(i), i, false)
	}
	a.st.HitBlocks += uint64(hits)
	if hits == len(seq) {
		return
	}
	for j := hits; j < len(seq); j++ {
		i := r.newBlock(seq[j])
		r.held[seq[j]] = i
		took(j, r.block(i), i, true)
	}
	r.used += len(seq) - hits
	a.st.NewBlocks += uint64(len(seq) - hits)
	a.storeRun(r.w, local, seq, hits, len(seq))
}

// storeRun stores seq[from:to] on w, under seq[from-1], through a buffer
// the tree does not keep.
func (a *Approx) storeRun(w kvevent.Worker, local, seq []uint64, from, to int) {
	st := kvevent.Stored{HasParent: from > 0, Blocks: a.stored[:0]}
	if from > 0 {
		st.ParentHash = seq[from-1]
	}
	for j := from; j < to; j++ {
		st.Blocks = append(st.Blocks, kvevent.StoredBlock{BlockHash: seq[j], TokensHash: local[j]})
	}
	a.apply(w, st)
	a.stored = st.Blocks[:0]
}

// newBlock returns the index of a new block of hash h, reusing a dropped
// one if any: a steady index allocates none.
func (r *approxRank) newBlock(h uint64) int32 {
	if n := len(r.spare); n > 0 {
		i := r.spare[n-1]
		r.spare = r.spare[:n-1]
		*r.block(i) = approxBlock{hash: h}
		return i
	}
	i := r.made
	if int(i>>chunkBits) == len(r.blocks) {
		r.blocks = append(r.blocks, make([]approxBlock, 1<<chunkBits))
	}
	r.made++
	r.block(i).hash = h
	return i
}

// apply applies one predicted event to the tree; the index builds only
// events the tree accepts, so an error is a defect, counted and kept as
// the last rejection.
func (a *Approx) apply(w kvevent.Worker, data kvevent.Data) {
	ev := kvevent.RouterEvent{WorkerID: w.ID, Tier: kvevent.TierDevice, Event: kvevent.Event{DPRank: w.DPRank, Data: data}}
	a.c.record(a.tree.Apply(ev))
}

// Release ends request id's lease (ApproxLRU: its copies become
// evictable, its last blocks first); false if id holds none (never
// predicted, released already, its worker removed, or ApproxTTL, which
// leases nothing).
func (a *Approx) Release(id uuid.UUID) (bool, error) {
	if a.closed.Load() {
		return false, ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.leases[id]
	if !ok {
		return false, nil
	}
	delete(a.leases, id)
	r := l.rank
	a.st.Releases++
	for j := len(l.blocks) - 1; j >= 0; j-- {
		i := l.blocks[j]
		b := r.block(i)
		if b.leases--; b.leases == 0 {
			r.pushFree(i)
		}
	}
	r.used -= l.private
	a.evict(r)
	return true, nil
}

// SetCapacity sets w's capacity in blocks (ApproxLRU; > 0), evicting
// what no longer fits.
func (a *Approx) SetCapacity(w kvevent.Worker, blocks int) error {
	if blocks <= 0 {
		return fmt.Errorf("shardpool: worker %v: capacity %d blocks, want > 0", w, blocks)
	}
	if a.closed.Load() {
		return ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rank(w)
	r.capacity = blocks
	a.evict(r)
	return nil
}

// pushFree puts block i last on the free list.
func (r *approxRank) pushFree(i int32) {
	head, b := r.block(0), r.block(i)
	last := head.prev
	b.prev, b.next = last, 0
	r.block(last).next = i
	head.prev = i
}

// unlink takes block i off the free list.
func (r *approxRank) unlink(i int32) {
	b := r.block(i)
	r.block(b.prev).next, r.block(b.next).prev = b.next, b.prev
	b.prev, b.next = 0, 0
}

// drop takes block i out of r, noting it gone; released or expired,
// nothing else names it, and its index is reused.
func (a *Approx) drop(r *approxRank, i int32) {
	h := r.block(i).hash
	delete(r.held, h)
	if len(r.gone) == 0 {
		a.touched = append(a.touched, r)
	}
	r.gone = append(r.gone, h)
	r.used--
	r.spare = append(r.spare, i)
}

// evict drops r's oldest released blocks while it holds more than its
// capacity (ApproxLRU), then applies the removals.
func (a *Approx) evict(r *approxRank) {
	for r.used > r.capacity && r.block(0).next != 0 {
		i := r.block(0).next
		r.unlink(i)
		a.drop(r, i)
		a.st.Evicted++
	}
	a.applyGone()
}

// expire drops every block whose expiry is at or before now (ApproxTTL).
// Callers hold a.mu.
func (a *Approx) expire(now time.Duration) {
	for a.head < len(a.expiry) && a.expiry[a.head].expires <= now {
		e := a.expiry[a.head]
		a.expiry[a.head] = approxExpiry{}
		a.head++
		if a.ranks[e.rank.w] != e.rank {
			continue // its worker was removed
		}
		// Deepest block first: a request's blocks expire tail first. One
		// refreshed since has a later expiry of its own.
		for j := len(e.seq) - 1; j >= 0; j-- {
			if i, ok := e.rank.held[e.seq[j]]; ok && e.rank.block(i).expires == e.expires {
				a.drop(e.rank, i)
				a.st.Expired++
			}
		}
	}
	if a.head > 1024 && a.head > len(a.expiry)/2 {
		a.expiry = a.expiry[:copy(a.expiry, a.expiry[a.head:])]
		a.head = 0
	}
	if a.head < len(a.expiry) {
		a.due.Store(int64(a.expiry[a.head].expires))
	} else {
		a.due.Store(math.MaxInt64)
	}
	a.applyGone()
}

// applyGone applies the removals of the ranks touched.
func (a *Approx) applyGone() {
	for _, r := range a.touched {
		a.apply(r.w, kvevent.Removed{BlockHashes: r.gone})
		r.gone = r.gone[:0]
	}
	clear(a.touched)
	a.touched = a.touched[:0]
}

// ApplyEvent implements Indexer: an approximate index reads no events; it
// counts them (Stats.Unread) and tells the observer ErrNotRead.
func (a *Approx) ApplyEvent(ev kvevent.RouterEvent) error {
	if a.closed.Load() {
		return ErrClosed
	}
	a.unread.Add(1)
	if a.c.observe != nil {
		a.c.observe(ev, ErrNotRead)
	}
	return nil
}

// FindMatches implements Indexer.
func (a *Approx) FindMatches(local []uint64) (radix.OverlapScores, error) {
	if a.closed.Load() {
		return radix.OverlapScores{}, ErrClosed
	}
	if a.cfg.Policy == ApproxTTL && int64(a.cfg.Now().Sub(a.epoch)) >= a.due.Load() {
		a.mu.Lock()
		a.expire(a.now())
		a.mu.Unlock()
	}
	return a.tree.FindMatches(local, false), nil
}

// FindMatchesForRequest implements Indexer.
func (a *Approx) FindMatchesForRequest(tokens []uint32, lora string) (radix.OverlapScores, error) {
	if a.closed.Load() {
		return radix.OverlapScores{}, ErrClosed
	}
	return a.h.match(tokens, lora, a.FindMatches)
}

// RemoveWorker implements Indexer: every rank of the worker is forgotten,
// its leases with it.
func (a *Approx) RemoveWorker(id kvevent.WorkerID) error {
	if a.closed.Load() {
		return ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for w := range a.ranks {
		if w.ID == id {
			a.dropRank(w)
		}
	}
	a.tree.RemoveWorker(id)
	a.c.removedWorkers.Add(1)
	return nil
}

// Forget drops what the index predicts of one (worker, rank), its leases
// with it (an engine that left, or that publishes events again).
func (a *Approx) Forget(w kvevent.Worker) error {
	if a.closed.Load() {
		return ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ranks[w] == nil {
		return nil
	}
	a.dropRank(w)
	a.apply(w, kvevent.Cleared{})
	return nil
}

// dropRank forgets rank w and its leases, leaving the tree to the caller
// (a.mu held). Its queued expiries are skipped when due.
func (a *Approx) dropRank(w kvevent.Worker) {
	delete(a.ranks, w)
	for req, l := range a.leases {
		if l.rank.w == w {
			delete(a.leases, req)
		}
	}
}

// Flush implements Indexer: predictions are applied as they are made.
func (a *Approx) Flush() (int, error) {
	if a.closed.Load() {
		return 0, ErrClosed
	}
	return 0, nil
}

// Close implements Indexer.
func (a *Approx) Close() error {
	if a.closed.Swap(true) {
		return ErrClosed
	}
	return nil
}

// Stats implements Indexer: Applied counts the predicted Stored and
// Removed events applied, Unread the KV events sent and not read.
func (a *Approx) Stats() Stats {
	st := a.c.stats(0)
	st.Unread = a.unread.Load()
	st.Pairs = a.tree.Size()
	return st
}

// ApproxStats returns the index's own counters.
func (a *Approx) ApproxStats() ApproxStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.st
	st.Leased = len(a.leases)
	for _, r := range a.ranks {
		st.Blocks += len(r.held)
	}
	return st
}

// Lanes implements Indexer: predictions are applied on the caller's
// goroutine.
func (a *Approx) Lanes() int { return 1 }

// BlockSize implements Indexer.
func (a *Approx) BlockSize() int { return a.cfg.BlockSize }

// Observe implements Indexer: f hears every KV event sent, with
// ErrNotRead.
func (a *Approx) Observe(f func(ev kvevent.RouterEvent, err error)) { a.c.observe = f }
