// Package router turns overlap scores into routing decisions and follows
// each request to completion, so that the next decision sees the real load.
//
// # Rules, against the reference router
//
// The cost, tie-breaks, softmax sampling and queueing follow Dynamo's
// kv-router (see Scheduler). Where kvradix answers, this is what it does:
//
//   - Data-parallel ranks: with Config.DPSize > 1 every (worker, rank) pair
//     is a candidate of its own (overlap, active blocks, prefill load,
//     tie-breaks, sampling); SelectWorkerRank returns the pair, SelectWorker
//     refuses to drop the rank. As the reference.
//   - Whole blocks: a request's new blocks and a worker's active blocks
//     count complete blocks only; a trailing partial block costs nothing.
//     As the reference's tracked sequences (tokens / block size).
//   - Duplicate ids: an id already active or waiting in the queue is
//     refused at once (ErrDuplicateRequest), before it can queue.
//   - Overlap weight: 8 by default, not the reference's 1; measured, and
//     the reason, on Config.
//   - What the index answers (engine-hash aliases, Cleared per rank,
//     self-parent chains) is package radix's, stated in its Semantics.
package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
)

var (
	// ErrUnknownRequest is returned for a request id the scheduler does not
	// track (never scheduled, or already freed).
	ErrUnknownRequest = errors.New("router: unknown request")
	// ErrDuplicateRequest is returned when a request id is scheduled twice.
	ErrDuplicateRequest = errors.New("router: request already scheduled")
	// ErrShutdown is returned by calls after Shutdown, and to requests that
	// were waiting in the queue when it happened.
	ErrShutdown = errors.New("router: shut down")
)

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	BlockSize          int     // tokens per KV block, > 0
	OverlapWeight      float64 // weight of prefill blocks in the cost, >= 0
	Temperature        float64 // 0: lowest cost wins; > 0: softmax sampling
	QueueThreshold     float64 // 0: no queueing; else see Scheduler
	MaxBatchedTokens   int     // the engines' max_num_batched_tokens
	TrackPrefillTokens bool    // count active prefill tokens in the cost
	Seed               uint64  // seeds tie-breaks and sampling
	// TierWeights is the prefill a block saves when cached in each tier
	// (indexed by kvevent.Tier), for requests that carry TierOverlaps: a
	// device block saves its whole prefill, one on the host most of it
	// (loading it back costs a transfer), disk and external less. All
	// zero: DefaultTierWeights.
	TierWeights [kvevent.NumTiers]float64
}

// DefaultTierWeights are SchedulerConfig.TierWeights' defaults: device 1,
// host 0.8, disk 0.5, external 0.3.
var DefaultTierWeights = [kvevent.NumTiers]float64{1, 0.8, 0.5, 0.3}

// SchedRequest is what the scheduler needs of a request.
type SchedRequest struct {
	ID uuid.UUID
	// ISL is the prompt length in tokens.
	ISL int
	// Blocks are the sequence hashes of the prompt's complete blocks.
	Blocks []uint64
	// Overlaps are the cached leading blocks per worker (the indexer's
	// scores); absent workers have none.
	Overlaps map[kvevent.Worker]uint32
	// TierOverlaps, if set, are the leading blocks per worker cached in
	// each tier or a nearer one (radix.TierScores); the prefill a worker
	// saves is then weighed by tier (SchedulerConfig.TierWeights) instead
	// of counting Overlaps' device blocks whole.
	TierOverlaps map[kvevent.Worker][kvevent.NumTiers]uint32
}

// PotentialLoad is a worker's projected load if a request were placed on it.
type PotentialLoad struct {
	Worker         kvevent.Worker
	PrefillTokens  int // active prefill tokens plus the request's uncached ones
	DecodeBlocks   int // active unique blocks plus the request's new ones
	ActiveRequests int // requests running now
}

// Scheduler tracks, per worker, the active sequences (the blocks of its
// running requests, reference counted so a block shared by two requests
// counts once) and the prefill tokens not yet computed, and places requests
// by cost:
//
//	prefill_blocks = (active_prefill_tokens + isl - overlap·block_size) / block_size
//	overlap        = the device blocks, or with TierOverlaps
//	                 Σ_tier weight(tier) · the blocks first cached in that tier
//	decode_blocks  = active unique blocks + the request's new blocks
//	cost           = overlap_weight · prefill_blocks + decode_blocks
//
// A request's new blocks on a worker are its complete blocks not already
// active there; a trailing partial block counts nowhere, neither in the
// request's new blocks nor in a worker's active blocks (as the reference's
// tracked sequences count tokens / block_size blocks). With temperature 0
// the lowest cost wins, ties broken uniformly at random; with temperature
// T > 0 a worker is drawn with probability ∝ exp(-c/T), c the costs
// normalised to [0, 1].
//
// Block sharing is found without visiting every worker: a map from sequence
// hash to the workers holding it active gives each worker's count of the
// request's blocks it already has, so a decision costs O(blocks + workers)
// with a few arithmetic operations per worker.
//
// Queueing (QueueThreshold > 0): while every worker's active prefill tokens
// exceed QueueThreshold·MaxBatchedTokens, requests wait in FIFO order until a
// prefill completes or a request is freed; waiting honours the context.
//
// All methods are safe for concurrent use; one mutex serialises them.
type Scheduler struct {
	cfg     SchedulerConfig
	mu      sync.Mutex
	workers []kvevent.Worker
	index   map[kvevent.Worker]int
	prefill []int // active prefill tokens per worker
	unique  []int // active unique blocks per worker
	active  []int // active requests per worker
	refs    map[uint64][]blockRef
	reqs    map[uuid.UUID]*activeRequest
	waiting map[uuid.UUID]struct{} // ids inside Schedule, before registration
	rng     *rand.Rand
	waiters []chan struct{}
	closed  bool

	// scratch, reused under mu
	overlap []uint32
	saved   []int // prompt tokens cached (with tiers, weighed by tier)

	hits       []int32
	touched    []int32 // workers with an overlap
	hitWorkers []int32 // workers with hits
	costs      []float64
}

type blockRef struct {
	worker int32
	count  int32
}

type activeRequest struct {
	worker  int
	blocks  []uint64
	prefill int // prefill tokens still counted
}

// errZeroScheduler is every call's error on a Scheduler not made by
// NewScheduler.
var errZeroScheduler = errors.New("router: a zero Scheduler has no workers (use NewScheduler)")

// errNoWorkers is Schedule's error while SetWorkers has left none.
var errNoWorkers = errors.New("router: no workers to schedule on")

// finiteNonNegative rejects NaN, infinities and negatives: an infinite
// weight or temperature turns every cost into Inf or NaN.
func finiteNonNegative(x float64) bool { return x >= 0 && !math.IsInf(x, 1) }

// NewScheduler returns a scheduler over the given workers.
func NewScheduler(cfg SchedulerConfig, workers []kvevent.Worker) (*Scheduler, error) {
	switch {
	case cfg.BlockSize <= 0:
		return nil, fmt.Errorf("router: block size %d, want > 0", cfg.BlockSize)
	case !finiteNonNegative(cfg.OverlapWeight):
		return nil, fmt.Errorf("router: overlap weight %v, want finite and >= 0", cfg.OverlapWeight)
	case !finiteNonNegative(cfg.Temperature):
		return nil, fmt.Errorf("router: temperature %v, want finite and >= 0", cfg.Temperature)
	case !finiteNonNegative(cfg.QueueThreshold):
		return nil, fmt.Errorf("router: queue threshold %v, want finite and >= 0", cfg.QueueThreshold)
	case cfg.QueueThreshold > 0 && cfg.MaxBatchedTokens <= 0:
		return nil, fmt.Errorf("router: max batched tokens %d, want > 0 with queueing", cfg.MaxBatchedTokens)
	case len(workers) == 0:
		return nil, errors.New("router: no workers")
	}
	if cfg.TierWeights == ([kvevent.NumTiers]float64{}) {
		cfg.TierWeights = DefaultTierWeights
	}
	for t, w := range cfg.TierWeights {
		if !finiteNonNegative(w) {
			return nil, fmt.Errorf("router: %v tier weight %v, want finite and >= 0", kvevent.Tier(t), w)
		}
	}
	n := len(workers)
	s := &Scheduler{
		cfg:     cfg,
		workers: append([]kvevent.Worker(nil), workers...),
		index:   make(map[kvevent.Worker]int, n),
		prefill: make([]int, n),
		unique:  make([]int, n),
		active:  make([]int, n),
		refs:    map[uint64][]blockRef{},
		reqs:    map[uuid.UUID]*activeRequest{},
		waiting: map[uuid.UUID]struct{}{},
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x6b76726164697821)),
		overlap: make([]uint32, n),
		saved:   make([]int, n),
		hits:    make([]int32, n),
		costs:   make([]float64, n),
	}
	for i, w := range workers {
		if _, dup := s.index[w]; dup {
			return nil, fmt.Errorf("router: worker %v listed twice", w)
		}
		s.index[w] = i
	}
	return s, nil
}

// Schedule picks a worker for req and registers the request on it. An id
// already active or waiting is refused at once with ErrDuplicateRequest.
// With queueing on, it may first wait; it returns ctx.Err() if the context
// ends while waiting, and ErrShutdown if the scheduler is closed.
func (s *Scheduler) Schedule(ctx context.Context, req SchedRequest) (kvevent.Worker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reqs == nil {
		return kvevent.Worker{}, errZeroScheduler
	}
	// A duplicate is refused before it can queue: an id active or waiting
	// now is never admitted later as new.
	_, active := s.reqs[req.ID]
	_, waiting := s.waiting[req.ID]
	if active || waiting {
		return kvevent.Worker{}, fmt.Errorf("%w: %v", ErrDuplicateRequest, req.ID)
	}
	s.waiting[req.ID] = struct{}{}
	err := s.admit(ctx)
	delete(s.waiting, req.ID)
	if err != nil {
		return kvevent.Worker{}, err
	}
	s.prepare(req)
	i := s.choose(req)
	s.register(req, i)
	s.reset(req)
	s.wakeHead()
	return s.workers[i], nil
}

// admit waits, with mu held on entry and exit, until the request may be
// scheduled: FIFO behind earlier waiters, while every worker is busy.
func (s *Scheduler) admit(ctx context.Context) error {
	if s.closed {
		return ErrShutdown
	}
	if len(s.workers) == 0 {
		return errNoWorkers
	}
	if s.cfg.QueueThreshold <= 0 || (len(s.waiters) == 0 && !s.allBusy()) {
		return nil
	}
	wake := make(chan struct{}, 1)
	s.waiters = append(s.waiters, wake)
	for {
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
		}
		s.mu.Lock()
		if s.closed {
			return ErrShutdown
		}
		if err := ctx.Err(); err != nil || len(s.workers) == 0 {
			if err == nil {
				err = errNoWorkers
			}
			s.dropWaiter(wake)
			s.wakeHead()
			return err
		}
		if s.waiters[0] == wake && !s.allBusy() {
			s.waiters = s.waiters[1:]
			return nil
		}
	}
}

func (s *Scheduler) dropWaiter(w chan struct{}) {
	for i, x := range s.waiters {
		if x == w {
			s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
			return
		}
	}
}

// wakeHead lets the first waiter re-check whether it may go.
func (s *Scheduler) wakeHead() {
	if len(s.waiters) > 0 {
		select {
		case s.waiters[0] <- struct{}{}:
		default:
		}
	}
}

func (s *Scheduler) allBusy() bool {
	limit := s.cfg.QueueThreshold * float64(s.cfg.MaxBatchedTokens)
	for _, p := range s.prefill {
		if float64(p) <= limit {
			return false
		}
	}
	return true
}

// prepare fills the scratch overlap and hit counts for req.
func (s *Scheduler) prepare(req SchedRequest) {
	for w, o := range req.Overlaps {
		if i, ok := s.index[w]; ok {
			s.overlap[i], s.saved[i] = o, int(o)*s.cfg.BlockSize
			s.touched = append(s.touched, int32(i))
		}
	}
	if req.TierOverlaps != nil {
		for w, cum := range req.TierOverlaps {
			i, ok := s.index[w]
			if !ok {
				continue
			}
			if s.overlap[i] == 0 {
				s.touched = append(s.touched, int32(i)) // cached off the device only
			}
			saved, prev := 0.0, uint32(0)
			for t, c := range cum {
				saved += s.cfg.TierWeights[t] * float64(c-min(prev, c))
				prev = max(prev, c)
			}
			s.saved[i] = int(math.Round(saved * float64(s.cfg.BlockSize)))
		}
	}
	for _, h := range req.Blocks {
		for _, r := range s.refs[h] {
			if s.hits[r.worker] == 0 {
				s.hitWorkers = append(s.hitWorkers, r.worker)
			}
			s.hits[r.worker]++
		}
	}
}

// reset zeroes the scratch prepare filled.
func (s *Scheduler) reset(req SchedRequest) {
	for _, i := range s.touched {
		s.overlap[i], s.saved[i] = 0, 0
	}
	s.touched = s.touched[:0]
	for _, i := range s.hitWorkers {
		s.hits[i] = 0
	}
	s.hitWorkers = s.hitWorkers[:0]
}

// prefillTokens is the request's uncached prompt on worker i (with tiers,
// the prompt less the tokens its cache saves, weighed by tier).
func (s *Scheduler) prefillTokens(isl, i int) int {
	return max(0, isl-s.saved[i])
}

// newBlocks is how many blocks the request adds to worker i's active set.
func (s *Scheduler) newBlocks(req SchedRequest, i int) int {
	return len(req.Blocks) - int(s.hits[i])
}

// costs fills s.costs for req; prepare must have run.
func (s *Scheduler) fillCosts(req SchedRequest) {
	fbs := float64(s.cfg.BlockSize)
	w := s.cfg.OverlapWeight
	base := len(req.Blocks)
	track := s.cfg.TrackPrefillTokens
	for i := range s.costs {
		pre := max(0, req.ISL-s.saved[i]) // prefillTokens, inlined by hand
		if track {
			pre += s.prefill[i]
		}
		dec := s.unique[i] + base - int(s.hits[i])
		s.costs[i] = w*float64(pre)/fbs + float64(dec)
	}
}

// choose returns the chosen worker for req; prepare must have run.
func (s *Scheduler) choose(req SchedRequest) int {
	s.fillCosts(req)
	if s.cfg.Temperature == 0 {
		best, ties := 0, 0
		for i, c := range s.costs {
			switch {
			case c < s.costs[best]:
				best, ties = i, 1
			case c == s.costs[best]:
				ties++
				if s.rng.IntN(ties) == 0 { // uniform among equals
					best = i
				}
			}
		}
		return best
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range s.costs {
		lo, hi = min(lo, c), max(hi, c)
	}
	span := hi - lo
	total := 0.0
	for i, c := range s.costs {
		norm := 0.0
		if span > 0 {
			norm = (c - lo) / span
		}
		p := math.Exp(-norm / s.cfg.Temperature)
		s.costs[i] = p
		total += p
	}
	x := s.rng.Float64() * total
	for i, p := range s.costs {
		if x < p {
			return i
		}
		x -= p
	}
	return len(s.costs) - 1
}

// register adds req to worker i's active sequences.
func (s *Scheduler) register(req SchedRequest, i int) {
	r := &activeRequest{worker: i, blocks: append([]uint64(nil), req.Blocks...)}
	if s.cfg.TrackPrefillTokens {
		r.prefill = s.prefillTokens(req.ISL, i)
		s.prefill[i] += r.prefill
	}
	for _, h := range r.blocks {
		refs := s.refs[h]
		found := false
		for j := range refs {
			if refs[j].worker == int32(i) {
				refs[j].count++
				found = true
				break
			}
		}
		if !found {
			s.refs[h] = append(refs, blockRef{worker: int32(i), count: 1})
			s.unique[i]++
		}
	}
	s.active[i]++
	s.reqs[req.ID] = r
}

// Admit registers a request placed on worker w elsewhere (another router
// replica), as Schedule would have: its blocks and prefill tokens count in
// w's load until MarkPrefillCompleted and Free. It does not queue.
func (s *Scheduler) Admit(req SchedRequest, w kvevent.Worker) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrShutdown
	}
	i, ok := s.index[w]
	if !ok {
		return fmt.Errorf("router: admit %v on unknown worker %v", req.ID, w)
	}
	_, active := s.reqs[req.ID]
	_, waiting := s.waiting[req.ID]
	if active || waiting {
		return fmt.Errorf("%w: %v", ErrDuplicateRequest, req.ID)
	}
	s.prepare(req)
	s.register(req, i)
	s.reset(req)
	return nil
}

// SetWorkers changes the workers the scheduler chooses among. A worker
// listed before and now keeps its load and its requests; a new one starts
// idle; the requests of a worker no longer listed are forgotten, as Free
// would, and their ids appended to dropped. With no workers, Schedule and
// Admit fail until some are set.
func (s *Scheduler) SetWorkers(dropped []uuid.UUID, workers []kvevent.Worker) ([]uuid.UUID, error) {
	index := make(map[kvevent.Worker]int, len(workers))
	for i, w := range workers {
		if _, dup := index[w]; dup {
			return dropped, fmt.Errorf("router: worker %v listed twice", w)
		}
		index[w] = i
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reqs == nil {
		return dropped, errZeroScheduler
	}
	to := make([]int32, len(s.workers)) // old position -> new, or -1
	for i, w := range s.workers {
		to[i] = -1
		if j, ok := index[w]; ok {
			to[i] = int32(j)
		}
	}
	for id, r := range s.reqs {
		if to[r.worker] < 0 {
			s.free(id, r)
			dropped = append(dropped, id)
		} else {
			r.worker = int(to[r.worker])
		}
	}
	for _, refs := range s.refs {
		for j := range refs {
			refs[j].worker = to[refs[j].worker] // only kept workers' refs are left
		}
	}
	n := len(workers)
	prefill, unique, active := make([]int, n), make([]int, n), make([]int, n)
	for i, j := range to {
		if j >= 0 {
			prefill[j], unique[j], active[j] = s.prefill[i], s.unique[i], s.active[i]
		}
	}
	s.workers, s.index = append([]kvevent.Worker(nil), workers...), index
	s.prefill, s.unique, s.active = prefill, unique, active
	s.overlap, s.saved, s.hits, s.costs = make([]uint32, n), make([]int, n), make([]int32, n), make([]float64, n)
	s.wakeHead()
	return dropped, nil
}

// MarkPrefillCompleted removes the request's prefill tokens from its
// worker's load (idempotent for a known request).
func (s *Scheduler) MarkPrefillCompleted(id uuid.UUID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	if !ok {
		return fmt.Errorf("%w: %v", ErrUnknownRequest, id)
	}
	s.prefill[r.worker] -= r.prefill
	r.prefill = 0
	s.wakeHead()
	return nil
}

// Free releases the request's blocks (and prefill tokens, if still counted)
// and forgets it.
func (s *Scheduler) Free(id uuid.UUID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	if !ok {
		return fmt.Errorf("%w: %v", ErrUnknownRequest, id)
	}
	s.free(id, r)
	s.wakeHead()
	return nil
}

// free releases request r, id, from its worker's load (mu held).
func (s *Scheduler) free(id uuid.UUID, r *activeRequest) {
	i := r.worker
	s.prefill[i] -= r.prefill
	for _, h := range r.blocks {
		refs := s.refs[h]
		for j := range refs {
			if refs[j].worker != int32(i) {
				continue
			}
			if refs[j].count--; refs[j].count == 0 {
				refs[j] = refs[len(refs)-1]
				refs = refs[:len(refs)-1]
				s.unique[i]--
			}
			break
		}
		if len(refs) == 0 {
			delete(s.refs, h)
		} else {
			s.refs[h] = refs
		}
	}
	s.active[i]--
	delete(s.reqs, id)
}

// PotentialLoads reports, per worker, the load it would have if req were
// placed on it.
func (s *Scheduler) PotentialLoads(req SchedRequest) []PotentialLoad {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prepare(req)
	out := make([]PotentialLoad, len(s.workers))
	for i, w := range s.workers {
		pre := s.prefillTokens(req.ISL, i)
		if s.cfg.TrackPrefillTokens {
			pre += s.prefill[i]
		}
		out[i] = PotentialLoad{Worker: w, PrefillTokens: pre, DecodeBlocks: s.unique[i] + s.newBlocks(req, i), ActiveRequests: s.active[i]}
	}
	s.reset(req)
	return out
}

// Active returns the number of requests the scheduler tracks.
func (s *Scheduler) Active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// Close fails every waiting and later Schedule with ErrShutdown.
func (s *Scheduler) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, w := range s.waiters {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	s.waiters = nil
}
