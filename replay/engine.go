// Package replay simulates a fleet of inference engines serving a trace on a
// virtual clock, routed by any kvradix router, and reports what the routing
// bought: prefix-cache reuse, time to first token, inter-token latency.
//
// Each mock engine models the parts of vLLM that matter to routing: a pool
// of KV blocks with prefix caching and LRU eviction (publishing Stored and
// Removed events through the router's sink, as a real engine does), and a
// step scheduler with continuous batching and chunked prefill whose step
// times come from the reference mocker's fitted model.
package replay

import (
	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
)

// EngineConfig sizes one mock engine.
type EngineConfig struct {
	Blocks           int // KV blocks in the pool
	BlockSize        int // tokens per block
	MaxBatchedTokens int // tokens per step (max_num_batched_tokens)
	MaxNumSeqs       int // running requests (max_num_seqs)
	HostBlocks       int // blocks of the host tier the pool offloads to (0: none; see offload.go)
}

// PrefillMs is the reference mocker's fitted prefill step time for n new
// tokens in a step.
func PrefillMs(n int) float64 {
	x := float64(n)
	return 4.209989e-7*x*x + 1.518344e-2*x + 16.50142
}

// DecodeMs is the reference mocker's fitted decode step time when a share p
// of the KV pool's tokens is active; at least 1 ms.
func DecodeMs(p float64) float64 {
	return max(1, -25.74*p*p+54.01*p+5.74)
}

// cblock is a registered (prefix-cached) block.
type cblock struct {
	hash          uint64
	parent, local uint64 // the previous block's hash, and its tokens hash: to offload it
	hasParent     bool
	ref           int
	prev, next    *cblock // free-list links while ref == 0
}

// request is a request's state inside an engine.
type request struct {
	id       uuid.UUID
	arrival  float64
	isl, osl int
	local    []uint64 // tokens hashes of the complete prompt blocks
	seq      []uint64 // their sequence hashes: the engine's block hashes
	blocks   []*cblock
	private  int    // blocks held outside the prefix cache
	hits     int    // prompt blocks found cached at admission
	held     uint32 // leading prompt blocks held at admission (the last one included)
	// predicted is the blocks the router counted cached on this engine, if
	// it predicts.
	predicted uint32
	predicts  bool
	loaded    int // prompt blocks after those, loaded back from the host
	computed  int // prompt tokens computed (cached ones included)
	chunk     int // prompt tokens computed in the current step
	tokens    int // output tokens generated
	first     float64
	last      float64
}

// engine is one mock vLLM engine. It is driven by the simulation loop on
// one goroutine.
type engine struct {
	id       int
	rank     kvevent.DPRank // of its worker, stamped on its events
	cfg      EngineConfig
	sink     router.EventSink
	sinkErrs int

	unallocated int
	cache       blockMap
	lru         cblock // sentinel of the free list; lru.next is the oldest
	lruLen      int
	waiting     []*request
	running     []*request
	busy        bool
	eventID     uint64
	spare       []*cblock // evicted blocks, for newBlock to reuse
	host        *hostTier // nil: no host tier
	transfer    float64   // ms of host loads in the step being composed
}

// newBlock returns a registered block of hash h with one reference,
// reusing an evicted one if any: an engine's blocks then cost one
// allocation each for the whole replay, not one per registration.
func (e *engine) newBlock(h uint64) *cblock {
	if n := len(e.spare); n > 0 {
		b := e.spare[n-1]
		e.spare = e.spare[:n-1]
		*b = cblock{hash: h, ref: 1}
		return b
	}
	return &cblock{hash: h, ref: 1}
}

func newEngine(id int, rank kvevent.DPRank, cfg EngineConfig, sink router.EventSink) *engine {
	e := &engine{id: id, rank: rank, cfg: cfg, sink: sink, unallocated: cfg.Blocks, cache: newBlockMap(cfg.Blocks)}
	e.lru.prev, e.lru.next = &e.lru, &e.lru
	if cfg.HostBlocks > 0 {
		e.host = newHostTier(cfg.HostBlocks)
	}
	return e
}

func (e *engine) pushFree(b *cblock) {
	b.prev, b.next = e.lru.prev, &e.lru
	e.lru.prev.next = b
	e.lru.prev = b
	e.lruLen++
}

func (e *engine) unlinkFree(b *cblock) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
	e.lruLen--
}

// blocksFor is the pool blocks a request occupies at its longest.
func (e *engine) blocksFor(isl, osl int) int { return router.BlocksFor(isl, osl, e.cfg.BlockSize) }

func (e *engine) publish(data kvevent.Data) { e.publishTier(data, kvevent.TierDevice) }

func (e *engine) publishTier(data kvevent.Data, tier kvevent.Tier) {
	e.eventID++
	if err := e.sink.PublishWithTier(kvevent.Event{ID: e.eventID, DPRank: e.rank, Data: data}, tier); err != nil {
		e.sinkErrs++
	}
}

// heldPrefix is how many leading prompt blocks the engine holds, whether
// or not it would recompute the last (the truth a router's overlap
// predicts).
func (e *engine) heldPrefix(r *request) uint32 {
	n := 0
	for n < len(r.seq) && e.cache.get(r.seq[n]) != nil {
		n++
	}
	return uint32(n)
}

// admit tries to give the request its blocks: cached prefix blocks are
// referenced, the rest allocated, evicting least recently used free blocks.
// The cached prefix leaves at least one prompt token to compute (as vLLM
// recomputes the last token).
func (e *engine) admit(r *request) bool {
	r.held = e.heldPrefix(r)
	hits := min(int(r.held), (r.isl-1)/e.cfg.BlockSize)
	need := e.blocksFor(r.isl, r.osl) - hits
	inFree := 0
	for _, h := range r.seq[:hits] {
		if e.cache.get(h).ref == 0 {
			inFree++
		}
	}
	if need > e.unallocated+e.lruLen-inFree {
		return false
	}
	r.blocks = make([]*cblock, len(r.seq))
	for j, h := range r.seq[:hits] {
		b := e.cache.get(h)
		if b.ref == 0 {
			e.unlinkFree(b)
		}
		b.ref++
		r.blocks[j] = b
	}
	loads := e.hostPrefix(r, hits)
	var evicted []*cblock
	if evict := need - e.unallocated; evict > 0 {
		evicted = make([]*cblock, 0, evict)
	}
	for range need {
		if e.unallocated > 0 {
			e.unallocated--
			continue
		}
		b := e.lru.next
		e.unlinkFree(b)
		e.cache.del(b.hash)
		evicted = append(evicted, b)
	}
	e.evict(evicted)
	r.private = need
	r.hits, r.loaded = hits, loads
	r.computed = (hits + loads) * e.cfg.BlockSize
	if loads > 0 { // loaded back from the host: now on the device too
		for _, h := range r.seq[hits : hits+loads] {
			e.host.touch(h)
		}
		e.registerComputed(r, hits)
		e.transfer += float64(loads*e.cfg.BlockSize) * HostLoadMs
	}
	return true
}

// evict publishes the blocks the device pool evicted (offloading them to
// the host tier, if any) and keeps their structs for reuse.
func (e *engine) evict(evicted []*cblock) {
	if len(evicted) == 0 {
		return
	}
	if e.host != nil {
		e.evictToHost(evicted)
	} else {
		hashes := make([]uint64, len(evicted))
		for i, b := range evicted {
			hashes[i] = b.hash
		}
		e.publish(kvevent.Removed{BlockHashes: hashes})
	}
	e.spare = append(e.spare, evicted...) // no request holds a free block
}

// computed records that the prompt's blocks up to r.computed are full and
// computed: each is registered in the prefix cache (with a Stored event),
// or, if another request registered the same block meanwhile, adopted.
func (e *engine) registerComputed(r *request, from int) {
	upto := min(r.computed/e.cfg.BlockSize, len(r.seq))
	var stored kvevent.Stored
	for j := from; j < upto; j++ {
		if r.blocks[j] != nil {
			continue
		}
		h := r.seq[j]
		if b := e.cache.get(h); b != nil {
			if b.ref == 0 {
				e.unlinkFree(b)
			}
			b.ref++
			r.blocks[j] = b
			r.private--
			e.unallocated++
			continue
		}
		b := e.newBlock(h)
		b.hasParent, b.local = j > 0, r.local[j]
		if j > 0 {
			b.parent = r.seq[j-1]
		}
		e.cache.put(b)
		r.blocks[j] = b
		r.private--
		if len(stored.Blocks) == 0 {
			stored.HasParent = j > 0
			if j > 0 {
				stored.ParentHash = r.seq[j-1]
			}
			stored.Blocks = make([]kvevent.StoredBlock, 0, upto-j) // at most the rest
		}
		stored.Blocks = append(stored.Blocks, kvevent.StoredBlock{BlockHash: h, TokensHash: r.local[j]})
	}
	if len(stored.Blocks) > 0 {
		e.publish(stored)
	}
}

// release frees a finished request's blocks; its last blocks go to the
// free list first, so they are evicted before its prefix.
func (e *engine) release(r *request) {
	for j := len(r.blocks) - 1; j >= 0; j-- {
		if b := r.blocks[j]; b != nil {
			if b.ref--; b.ref == 0 {
				e.pushFree(b)
			}
		}
	}
	e.unallocated += r.private
	r.blocks = nil
}

// step composes the next batch: running decodes take a token each, running
// prefills a chunk, then waiting requests are admitted in FIFO order while
// tokens, sequences and blocks last. It returns the step's duration in ms
// (the prefill model for the step's prefill tokens, plus the decode model
// if any request makes a token), or false when there is nothing to run.
func (e *engine) step() (float64, bool) {
	budget := e.cfg.MaxBatchedTokens
	prefill := 0
	for _, r := range e.running {
		r.chunk = 0
		if r.computed >= r.isl {
			budget--
		}
	}
	for _, r := range e.running {
		if r.computed < r.isl && budget > 0 {
			r.chunk = min(r.isl-r.computed, budget)
			budget -= r.chunk
			prefill += r.chunk
		}
	}
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs && budget > 0 {
		r := e.waiting[0]
		if !e.admit(r) {
			break
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		r.chunk = min(r.isl-r.computed, budget)
		budget -= r.chunk
		prefill += r.chunk
	}
	if len(e.running) == 0 {
		return 0, false
	}
	transfer := e.transfer
	e.transfer = 0
	// As the reference mocker's pass: the prefill chunks run first, then
	// one decode iteration for every request that has all its tokens
	// computed by then (decodes, and prefills completing in this step, whose
	// first token it makes); a step with both costs both.
	ms, decodes, active := transfer, false, 0
	if prefill > 0 {
		ms = PrefillMs(prefill)
	}
	for _, r := range e.running {
		active += r.computed + r.chunk + r.tokens
		decodes = decodes || r.computed+r.chunk >= r.isl
	}
	if decodes {
		ms += DecodeMs(float64(active) / float64(e.cfg.Blocks*e.cfg.BlockSize))
	}
	return ms, true
}

// observer hears what a step produced.
type observer interface {
	firstToken(r *request)
	token(gap float64) // an inter-token gap, ms
	done(r *request)
}

// finishStep applies the step that ends at now: prefill chunks complete
// (publishing their blocks; a finished prefill emits the first token),
// decodes emit a token each.
func (e *engine) finishStep(now float64, obs observer) {
	keep := e.running[:0]
	for _, r := range e.running {
		switch {
		case r.chunk > 0:
			from := r.computed / e.cfg.BlockSize
			r.computed += r.chunk
			e.registerComputed(r, from)
			if r.computed >= r.isl {
				r.tokens, r.first, r.last = 1, now, now
				obs.firstToken(r)
			}
		case r.computed >= r.isl:
			r.tokens++
			obs.token(now - r.last)
			r.last = now
		}
		if r.computed >= r.isl && r.tokens >= max(r.osl, 1) {
			e.release(r)
			obs.done(r)
			continue
		}
		keep = append(keep, r)
	}
	clear(e.running[len(keep):])
	e.running = keep
}
