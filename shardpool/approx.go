package shardpool

import (
	"errors"
	"fmt"
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
// stream would be. Writers (Predict, Release, SetCapacity, RemoveWorker)
// are serialised by a mutex; FindMatches reads the tree without it, except
// that an ApproxTTL index first drops what has expired. All methods are
// safe for concurrent use.
type Approx struct {
	cfg    ApproxConfig
	ttl    time.Duration
	h      *hasher
	tree   *radix.CompressedTree
	closed atomic.Bool
	c      counters
	unread atomic.Uint64

	mu      sync.Mutex
	epoch   time.Time // the clock's first reading: times are kept as offsets from it
	last    time.Duration
	ranks   map[kvevent.Worker]*approxRank
	leases  map[uuid.UUID]approxLease
	expiry  []approxExpiry // ApproxTTL: (rank, hash, time) in expiry order; stale ones skipped
	head    int            // expiry[:head] are done
	touched []*approxRank  // ranks with removals to apply
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

// approxRank is one (worker, rank)'s predicted pool.
type approxRank struct {
	w        kvevent.Worker
	capacity int
	used     int // blocks held and leased private blocks
	held     map[uint64]*approxCopy
	free     approxCopy // sentinel of released copies; free.next is the oldest
	gone     []uint64   // hashes whose last copy went, not yet applied
}

// approxCopy is a block in a rank's pool.
type approxCopy struct {
	hash       uint64
	leases     int32
	expires    time.Duration // ApproxTTL
	prev, next *approxCopy   // the free list, while released (ApproxLRU)
}

// approxLease is what a routed request holds until Release.
type approxLease struct {
	rank    *approxRank
	copies  []*approxCopy
	private int
}

type approxExpiry struct {
	rank    *approxRank
	hash    uint64
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
		r = &approxRank{w: w, capacity: a.cfg.Capacity, held: make(map[uint64]*approxCopy)}
		r.free.prev, r.free.next = &r.free, &r.free
		a.ranks[w] = r
	}
	return r
}

// Predict records that request id was routed to w: local are its complete
// prompt blocks' local hashes and seq their sequence hashes (equal
// lengths), extra the blocks it takes beyond them (its partial prompt
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
		a.place(r, local, seq, func(_ int, c *approxCopy) { c.expires = t })
		// Expiries are queued deepest block first: a request's blocks expire
		// tail first.
		for j := len(seq) - 1; j >= 0; j-- {
			a.expiry = append(a.expiry, approxExpiry{rank: r, hash: seq[j], expires: t})
		}
		return nil
	}
	l := approxLease{rank: r, copies: make([]*approxCopy, len(seq)), private: extra}
	a.place(r, local, seq, func(j int, c *approxCopy) {
		if c.leases == 0 && c.next != nil {
			c.unlink()
		}
		c.leases++
		l.copies[j] = c
	})
	r.used += extra
	a.leases[id] = l
	a.evict(r)
	return nil
}

// place hands each of seq's blocks on r to took, making the blocks r does
// not hold (with chain hashes, every block after the first it lacks) and
// storing them in the tree: runs of them, each under its parent, which r
// holds (every block before it in seq was placed already).
func (a *Approx) place(r *approxRank, local, seq []uint64, took func(j int, c *approxCopy)) {
	var st kvevent.Stored
	flush := func() {
		if len(st.Blocks) > 0 {
			a.apply(r.w, st)
		}
		st = kvevent.Stored{}
	}
	hits := 0
	for hits < len(seq) && r.held[seq[hits]] != nil {
		hits++
	}
	for j, h := range seq {
		c := r.held[h]
		if c != nil {
			flush()
			took(j, c)
			continue
		}
		c = &approxCopy{hash: h}
		if len(st.Blocks) == 0 {
			st = kvevent.Stored{HasParent: j > 0, Blocks: make([]kvevent.StoredBlock, 0, len(seq)-j)}
			if j > 0 {
				st.ParentHash = seq[j-1]
			}
		}
		st.Blocks = append(st.Blocks, kvevent.StoredBlock{BlockHash: h, TokensHash: local[j]})
		r.held[h] = c
		r.used++
		a.st.NewBlocks++
		took(j, c)
	}
	a.st.HitBlocks += uint64(hits)
	flush()
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
	for j := len(l.copies) - 1; j >= 0; j-- {
		if c := l.copies[j]; c != nil {
			if c.leases--; c.leases == 0 {
				r.pushFree(c)
			}
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

func (r *approxRank) pushFree(c *approxCopy) {
	c.prev, c.next = r.free.prev, &r.free
	r.free.prev.next = c
	r.free.prev = c
}

func (c *approxCopy) unlink() {
	c.prev.next, c.next.prev = c.next, c.prev
	c.prev, c.next = nil, nil
}

// drop takes block c out of r, noting it gone.
func (a *Approx) drop(r *approxRank, c *approxCopy) {
	delete(r.held, c.hash)
	if len(r.gone) == 0 {
		a.touched = append(a.touched, r)
	}
	r.gone = append(r.gone, c.hash)
	r.used--
}

// evict drops r's oldest released copies while it holds more than its
// capacity (ApproxLRU), then applies the removals.
func (a *Approx) evict(r *approxRank) {
	for r.used > r.capacity && r.free.next != &r.free {
		c := r.free.next
		c.unlink()
		a.drop(r, c)
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
		if c := e.rank.held[e.hash]; c != nil && c.expires == e.expires && a.ranks[e.rank.w] == e.rank {
			a.drop(e.rank, c)
			a.st.Expired++
		}
	}
	if a.head > 1024 && a.head > len(a.expiry)/2 {
		a.expiry = a.expiry[:copy(a.expiry, a.expiry[a.head:])]
		a.head = 0
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
	if a.cfg.Policy == ApproxTTL {
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
			delete(a.ranks, w)
		}
	}
	for req, l := range a.leases {
		if l.rank.w.ID == id {
			delete(a.leases, req)
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
	delete(a.ranks, w)
	for req, l := range a.leases {
		if l.rank.w == w {
			delete(a.leases, req)
		}
	}
	a.apply(w, kvevent.Cleared{})
	return nil
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
