package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// Mode is a routing policy.
type Mode int

const (
	// RoundRobin cycles through the workers and ignores KV events.
	RoundRobin Mode = iota
	// KV matches each request against the workers' cached blocks and
	// schedules it by cost (see Scheduler).
	KV
	// KVTiers is KV counting every tier a worker caches blocks in, each
	// block's saved prefill weighed by its tier (Config.TierWeights), over
	// an indexer that keeps tiers (shardpool.TierIndexer).
	KVTiers
	// KVApproxLRU is KV without events: the index predicts what each rank
	// caches from the router's own decisions and completions, modelling a
	// pool of Config.ApproxCapacity blocks per rank (shardpool.ApproxLRU).
	// Events published to it are counted and not read.
	KVApproxLRU
	// KVApproxTTL is KV without events, each routed block predicted cached
	// for Config.ApproxTTL after its latest routing (shardpool.ApproxTTL).
	KVApproxTTL
	// KVPredict is KV with events and, beside them, every decision
	// predicted for Config.PredictTTL: a worker's overlap is the greater of
	// the two, so that a burst of requests sharing a prefix follows the
	// first before its blocks are stored and published.
	KVPredict
)

// modeNames are the modes' names, by mode.
var modeNames = [...]string{RoundRobin: "round_robin", KV: "kv", KVTiers: "kv_tiers", KVApproxLRU: "kv_approx_lru", KVApproxTTL: "kv_approx_ttl", KVPredict: "kv_predict"}

// String returns the mode's name: "round_robin", "kv", "kv_tiers",
// "kv_approx_lru", "kv_approx_ttl" or "kv_predict".
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// ParseMode returns the mode a name names (String's inverse).
func ParseMode(name string) (Mode, error) {
	for m, n := range modeNames {
		if n == name {
			return Mode(m), nil
		}
	}
	return 0, fmt.Errorf("router: unknown mode %q (want one of %v)", name, modeNames)
}

// approximate reports whether the mode reads no events.
func (m Mode) approximate() bool { return m == KVApproxLRU || m == KVApproxTTL }

// policy is the prediction policy of an approximate mode or KVPredict.
func (m Mode) policy() shardpool.ApproxPolicy {
	if m == KVApproxLRU {
		return shardpool.ApproxLRU
	}
	return shardpool.ApproxTTL
}

// Config mirrors the reference router's configuration, with one default
// changed on purpose: OverlapWeight is 8, not the reference's 1.
//
// With weight 1 the cost is dominated by the active blocks (memory), and
// the router gives up cached prefixes to even out occupancy that the
// engines' step times hardly feel; prefill time grows with every uncached
// token. Measured by `loadgen replay -sweep overlap_weight=...`
// (results/replay-sweep.txt): on the embedded Mooncake trace weight 8 lifts
// the KV router from 0.84 to 0.93 of a pooled cache's reuse and lowers mean
// TTFT (195 → 189 ms); on two synthetic workloads of other shapes it lifts
// reuse and lowers TTFT too. Higher weights gain little more and spread
// the load unevenly.
type Config struct {
	BlockSize          int     // tokens per KV block (16)
	OverlapWeight      float64 // weight of prefill blocks in the cost (8; the reference: 1)
	Temperature        float64 // 0: lowest cost wins; > 0: softmax sampling (0)
	IndexerLanes       int     // 1: the single-threaded indexer; more: the pool (2)
	QueueThreshold     float64 // 0: off; else queue while every worker is busy (0)
	MaxBatchedTokens   int     // the engines' max_num_batched_tokens (8192)
	TrackPrefillTokens bool    // count active prefill tokens in the cost (true)
	Seed               uint64  // seeds tie-breaks and sampling (0)
	DPSize             int     // data-parallel ranks per worker (1); 0 means 1
	// TierWeights is the prefill a cached block saves per tier, in
	// KVTiers mode (SchedulerConfig.TierWeights; all zero:
	// DefaultTierWeights: device 1, host 0.8, disk 0.5, external 0.3).
	TierWeights [kvevent.NumTiers]float64
	// OnAdmit, if set, hears every KV-mode admission (for sharing load
	// with other replicas: see package cluster). It runs on the caller's
	// goroutine after the decision and must be quick.
	OnAdmit func(id uuid.UUID, a Admission)
	// ApproxCapacity is every rank's KV blocks, the engine's
	// total_kv_blocks (KVApproxLRU; > 0).
	ApproxCapacity int
	// ApproxTTL is how long KVApproxTTL predicts a routed block cached
	// (0: shardpool.DefaultApproxTTL).
	ApproxTTL time.Duration
	// PredictTTL is how long KVPredict keeps a decision beside the events
	// (0: DefaultPredictTTL).
	PredictTTL time.Duration
	// Now is the clock of the predictions' lifetimes (nil: time.Now).
	Now func() time.Time
}

// DefaultPredictTTL is Config.PredictTTL's default: long enough for a
// request's prefill to be stored and its event applied, short enough that
// a prediction never outlives the events' word by much.
const DefaultPredictTTL = 2 * time.Second

// MaxDPSize bounds Config.DPSize.
const MaxDPSize = 4096

// DefaultOverlapWeight is Config.OverlapWeight's default (see Config).
const DefaultOverlapWeight = 8

// DefaultConfig returns the defaults named on each field.
func DefaultConfig() Config {
	return Config{
		BlockSize:          16,
		OverlapWeight:      DefaultOverlapWeight,
		IndexerLanes:       2,
		MaxBatchedTokens:   8192,
		TrackPrefillTokens: true,
	}
}

// Request is a request to route.
type Request struct {
	UUID            uuid.UUID // required; uuid.Nil is an error
	Tokens          []uint32
	MaxOutputTokens int // must fit a u32
	// Local and PromptTokens, when Local is not nil, stand for Tokens: the
	// prompt's local block hashes at the router's block size (as
	// hashing.LocalHashes computes them) and its length in tokens, which
	// must make exactly len(Local) complete blocks. A caller that hashed
	// the prompt already (the replay hashes each request once for every
	// router and engine) spares the router hashing it again. The router
	// only reads Local.
	Local        []uint64
	PromptTokens int
}

// EventSink is what a worker publishes its KV events through.
type EventSink interface {
	// Publish publishes a Device-tier event.
	Publish(kvevent.Event) error
	// PublishWithTier publishes an event of the given tier.
	PublishWithTier(kvevent.Event, kvevent.Tier) error
}

// Router routes requests over workers 0..numWorkers-1, each with DPSize
// data-parallel ranks, either round robin or by KV overlap and load. Worker
// i publishes its events (every rank's, with Event.DPRank set) through
// Sink(kvevent.WorkerID(i)). With DPSize 1, SelectWorker returns such an i;
// with more ranks the scheduler weighs every (worker, rank) pair apart —
// overlap, active blocks, prefill load, tie-breaks and sampling — and
// SelectWorkerRank returns the pair.
//
// All methods are safe for concurrent use.
type Router struct {
	mode    Mode
	cfg     Config
	n       int
	dp      int
	indexer shardpool.Indexer // KV modes only
	sched   *Scheduler        // KV modes only
	// predict hears every decision and completion: the indexer itself in
	// the approximate modes, the side index merged with the events' in
	// KVPredict, nil otherwise.
	predict *shardpool.Approx
	rr      atomic.Uint64
	closed  atomic.Bool
}

// New returns a router with its own indexer: the single-threaded one for
// IndexerLanes 1, else a pool of that many lanes over the compressed index;
// in KVTiers mode the same, keeping every tier; in the approximate modes a
// shardpool.Approx. Invalid configuration is an error.
func New(mode Mode, cfg Config, numWorkers int) (*Router, error) {
	if cfg.IndexerLanes < 1 {
		return nil, fmt.Errorf("router: %d indexer lanes, want >= 1", cfg.IndexerLanes)
	}
	if err := validate(mode, cfg, numWorkers); err != nil {
		return nil, err
	}
	var idx shardpool.Indexer
	switch {
	case mode == KVTiers && cfg.IndexerLanes == 1:
		idx = shardpool.NewSingleTiers(cfg.BlockSize)
	case mode == KVTiers:
		idx = shardpool.NewPoolTiers(cfg.IndexerLanes, cfg.BlockSize)
	case mode.approximate():
		a, err := newApprox(mode, cfg)
		if err != nil {
			return nil, err
		}
		idx = a
	case mode == KV || mode == KVPredict:
		if cfg.IndexerLanes == 1 {
			idx = shardpool.NewSingle(cfg.BlockSize)
		} else {
			idx = shardpool.NewPool(cfg.IndexerLanes, cfg.BlockSize)
		}
	}
	r, err := newRouter(mode, cfg, numWorkers, idx)
	if err != nil && idx != nil {
		_ = idx.Close()
	}
	return r, err
}

// newApprox returns the prediction index of an approximate mode or
// KVPredict.
func newApprox(mode Mode, cfg Config) (*shardpool.Approx, error) {
	ac := shardpool.ApproxConfig{Policy: mode.policy(), BlockSize: cfg.BlockSize, Capacity: cfg.ApproxCapacity, TTL: cfg.ApproxTTL, Now: cfg.Now}
	if mode == KVPredict {
		ac.TTL = cmp.Or(cfg.PredictTTL, DefaultPredictTTL)
	}
	a, err := shardpool.NewApprox(ac)
	if err != nil {
		return nil, fmt.Errorf("router: %v: %w", mode, err)
	}
	return a, nil
}

// NewWithIndexer returns a router over the caller's indexer (KV modes; nil
// in round-robin mode), which must hash at cfg.BlockSize: in the
// approximate modes a *shardpool.Approx of the mode's policy.
// Config.IndexerLanes is ignored. The router owns the indexer from then on:
// Shutdown closes it.
func NewWithIndexer(mode Mode, cfg Config, numWorkers int, idx shardpool.Indexer) (*Router, error) {
	if err := validate(mode, cfg, numWorkers); err != nil {
		return nil, err
	}
	if (mode != RoundRobin) != (idx != nil) {
		return nil, fmt.Errorf("router: %v mode with indexer %v: KV modes need one, round robin none", mode, idx)
	}
	if ti, ok := idx.(shardpool.TierIndexer); mode == KVTiers && (!ok || !ti.KeepsTiers()) {
		return nil, fmt.Errorf("router: %v mode needs an indexer that keeps tiers (shardpool.NewSingleTiers, NewPoolTiers)", mode)
	}
	if a, ok := idx.(*shardpool.Approx); mode.approximate() && (!ok || a.Policy() != mode.policy()) {
		return nil, fmt.Errorf("router: %v mode needs a shardpool.Approx of its policy", mode)
	}
	return newRouter(mode, cfg, numWorkers, idx)
}

func validate(mode Mode, cfg Config, numWorkers int) error {
	switch {
	case mode < RoundRobin || int(mode) >= len(modeNames):
		return fmt.Errorf("router: unknown mode %d", int(mode))
	case numWorkers <= 0:
		return fmt.Errorf("router: %d workers, want > 0", numWorkers)
	case cfg.DPSize < 0 || cfg.DPSize > MaxDPSize:
		return fmt.Errorf("router: dp size %d, want in [1, %d]", cfg.DPSize, MaxDPSize)
	case uint64(numWorkers)*uint64(max(cfg.DPSize, 1)) > 1<<24:
		return fmt.Errorf("router: %d workers x %d ranks, want at most %d pairs", numWorkers, cfg.DPSize, 1<<24)
	}
	return nil
}

func newRouter(mode Mode, cfg Config, numWorkers int, idx shardpool.Indexer) (*Router, error) {
	dp := max(cfg.DPSize, 1)
	workers := make([]kvevent.Worker, 0, numWorkers*dp)
	for i := range numWorkers {
		for rank := range dp {
			workers = append(workers, kvevent.Worker{ID: kvevent.WorkerID(i), DPRank: kvevent.DPRank(rank)})
		}
	}
	sched, err := NewScheduler(SchedulerConfig{
		BlockSize:          cfg.BlockSize,
		OverlapWeight:      cfg.OverlapWeight,
		Temperature:        cfg.Temperature,
		QueueThreshold:     cfg.QueueThreshold,
		MaxBatchedTokens:   cfg.MaxBatchedTokens,
		TrackPrefillTokens: cfg.TrackPrefillTokens,
		Seed:               cfg.Seed,
		TierWeights:        cfg.TierWeights,
	}, workers)
	if err != nil {
		return nil, err
	}
	r := &Router{mode: mode, cfg: cfg, n: numWorkers, dp: dp}
	if mode == RoundRobin {
		return r, nil
	}
	r.sched, r.indexer = sched, idx
	switch {
	case mode.approximate():
		r.predict = idx.(*shardpool.Approx)
	case mode == KVPredict:
		if r.predict, err = newApprox(mode, cfg); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Mode returns the router's mode.
func (r *Router) Mode() Mode { return r.mode }

// Workers returns the number of workers.
func (r *Router) Workers() int { return r.n }

// DPSize returns the data-parallel ranks per worker.
func (r *Router) DPSize() int { return r.dp }

// Stats is what a router's callers read of it.
type Stats struct {
	Mode    Mode
	Workers int
	DPSize  int
	// IndexerLanes is 1 for the single-threaded indexer, the pool's lanes,
	// or 0 in round-robin mode.
	IndexerLanes int
	// Index are the indexer's counters (zero in round-robin mode).
	Index shardpool.Stats
	// Active is the number of requests tracked between SelectWorker and
	// OnComplete (0 in round-robin mode).
	Active int
	// TierWeights are the prefill a cached block saves per tier, in
	// KVTiers mode (zero otherwise: the device alone counts, whole).
	TierWeights [kvevent.NumTiers]float64
	// Approx are the predictions' counters, in the approximate modes and
	// KVPredict.
	Approx shardpool.ApproxStats
}

// Stats returns the router's counters.
func (r *Router) Stats() Stats {
	st := Stats{Mode: r.mode, Workers: r.n, DPSize: r.dp}
	if r.indexer != nil {
		st.IndexerLanes, st.Index = r.indexer.Lanes(), r.indexer.Stats()
	}
	if r.sched != nil {
		st.Active = r.sched.Active()
	}
	if r.mode == KVTiers {
		st.TierWeights = r.sched.cfg.TierWeights
	}
	if r.predict != nil {
		st.Approx = r.predict.ApproxStats()
	}
	return st
}

type sink struct {
	r      *Router
	worker kvevent.WorkerID
	err    error
}

func (s sink) Publish(ev kvevent.Event) error { return s.PublishWithTier(ev, kvevent.TierDevice) }

func (s sink) PublishWithTier(ev kvevent.Event, tier kvevent.Tier) error {
	switch {
	case s.err != nil:
		return s.err
	case s.r.closed.Load():
		return ErrShutdown
	case int(ev.DPRank) >= s.r.dp:
		return fmt.Errorf("router: worker %d: event %d from rank %d, want < dp size %d", s.worker, ev.ID, ev.DPRank, s.r.dp)
	case s.r.indexer == nil:
		return nil // round robin: events are not needed
	}
	err := s.r.indexer.ApplyEvent(kvevent.RouterEvent{WorkerID: s.worker, Tier: tier, Event: ev})
	if errors.Is(err, shardpool.ErrClosed) {
		return ErrShutdown
	}
	return err
}

// Sink returns the publisher worker uses for its KV events. A worker id
// outside 0..numWorkers-1 gets a sink whose every call fails; an event from
// a rank outside 0..DPSize-1 fails.
func (r *Router) Sink(worker kvevent.WorkerID) EventSink {
	if uint64(worker) >= uint64(r.n) {
		return sink{err: fmt.Errorf("router: worker %d out of range [0,%d)", worker, r.n)}
	}
	return sink{r: r, worker: worker}
}

// errRanks is SelectWorker's answer when a worker id alone would lose the
// rank.
var errRanks = errors.New("router: DPSize > 1: use SelectWorkerRank, a worker id alone loses the rank")

// SelectWorker routes a request to a worker id; with DPSize > 1 it is an
// error (see SelectWorkerRank).
func (r *Router) SelectWorker(ctx context.Context, req Request) (int, error) {
	if r.dp > 1 {
		return 0, errRanks
	}
	w, err := r.SelectWorkerRank(ctx, req)
	return int(w.ID), err
}

// SelectWorkerRank routes a request to a (worker, rank) pair. In KV mode it
// matches the tokens through the indexer, schedules by cost and registers
// the request until OnComplete.
func (r *Router) SelectWorkerRank(ctx context.Context, req Request) (kvevent.Worker, error) {
	switch {
	case r.closed.Load():
		return kvevent.Worker{}, ErrShutdown
	case r.n == 0:
		return kvevent.Worker{}, errors.New("router: a zero Router has no workers (use New)")
	}
	if req.UUID == uuid.Nil {
		return kvevent.Worker{}, errors.New("router: request without a UUID")
	}
	if req.MaxOutputTokens < 0 || uint64(req.MaxOutputTokens) > math.MaxUint32 {
		return kvevent.Worker{}, fmt.Errorf("router: request %v: max output tokens %d do not fit a u32", req.UUID, req.MaxOutputTokens)
	}
	if r.mode == RoundRobin {
		k := (r.rr.Add(1) - 1) % uint64(r.n*r.dp)
		return kvevent.Worker{ID: kvevent.WorkerID(k / uint64(r.dp)), DPRank: kvevent.DPRank(k % uint64(r.dp))}, nil
	}
	local, isl := req.Local, req.PromptTokens
	if local == nil {
		local = hashing.LocalHashes(make([]uint64, 0, len(req.Tokens)/r.cfg.BlockSize), req.Tokens, r.cfg.BlockSize, hashing.Options{})
		isl = len(req.Tokens)
	} else if bs := r.cfg.BlockSize; isl < len(local)*bs || isl >= (len(local)+1)*bs {
		return kvevent.Worker{}, fmt.Errorf("router: request %v: %d local hashes of %d-token blocks do not make a %d-token prompt", req.UUID, len(local), bs, isl)
	}
	sr := SchedRequest{ID: req.UUID, ISL: isl, Blocks: hashing.SequenceHashes(local[:0:0], local)}
	if err := r.match(&sr, local); err != nil {
		return kvevent.Worker{}, r.shutdownErr(err)
	}
	w, err := r.sched.Schedule(ctx, sr)
	if err != nil {
		return w, err
	}
	if r.predict != nil {
		// The blocks the request takes beyond its complete prompt blocks:
		// its partial last block and its output (at least one token).
		extra := BlocksFor(isl, req.MaxOutputTokens, r.cfg.BlockSize) - len(local)
		if err := r.predict.Predict(req.UUID, w, local, sr.Blocks, extra); err != nil {
			_ = r.sched.Free(req.UUID)
			return kvevent.Worker{}, r.shutdownErr(err)
		}
	}
	if r.cfg.OnAdmit != nil {
		a := Admission{Worker: w, ISL: sr.ISL, Blocks: sr.Blocks, Overlap: sr.Overlaps[w]}
		if r.predict != nil {
			a.Local = local // the other replicas' predictions need them
		}
		r.cfg.OnAdmit(req.UUID, a)
	}
	return w, nil
}

// BlocksFor is the KV blocks of bs tokens a request of isl prompt and osl
// output tokens (at least one) takes at its longest, as an engine
// allocates them.
func BlocksFor(isl, osl, bs int) int {
	// Summed unsigned (two non-negative ints cannot overflow it), so that
	// no length (2^63-1 tokens of output, say) wraps into a small one.
	n := (uint64(max(isl, 0)) + uint64(max(osl, 1)) + uint64(bs) - 1) / uint64(bs)
	return int(min(n, math.MaxInt))
}

// match fills sr's overlaps from the indexer: the device's, and in
// KVTiers mode every tier's; in KVPredict the greater of the events' and
// the predictions'.
func (r *Router) match(sr *SchedRequest, local []uint64) error {
	if r.mode != KVTiers {
		scores, err := r.indexer.FindMatches(local)
		sr.Overlaps = scores.Scores
		if err != nil || r.mode != KVPredict {
			return err
		}
		if sr.Overlaps == nil {
			sr.Overlaps = make(map[kvevent.Worker]uint32)
		}
		predicted, err := r.predict.FindMatches(local)
		for w, n := range predicted.Scores {
			if n > sr.Overlaps[w] {
				sr.Overlaps[w] = n
			}
		}
		return err
	}
	tiers, err := r.indexer.(shardpool.TierIndexer).FindTierMatches(local)
	if err != nil {
		return err
	}
	sr.TierOverlaps = tiers.Scores
	sr.Overlaps = make(map[kvevent.Worker]uint32, len(tiers.Scores))
	for w, cum := range tiers.Scores {
		if cum[kvevent.TierDevice] > 0 {
			sr.Overlaps[w] = cum[kvevent.TierDevice]
		}
	}
	return nil
}

// Admission is a KV-mode routing decision as another router replica needs
// it to count the request's load: the worker, the prompt's length and
// complete blocks' sequence hashes, and the blocks the worker had cached;
// from a router that predicts (the approximate modes, KVPredict), the
// blocks' local hashes too, so that the others predict it as well.
type Admission struct {
	Worker  kvevent.Worker `json:"worker"`
	ISL     int            `json:"isl"`
	Blocks  []uint64       `json:"blocks"`
	Overlap uint32         `json:"overlap"`
	Local   []uint64       `json:"local,omitempty"`
}

// AdmitRemote counts a request another replica admitted, so that this
// router's decisions see its load; OnFirstToken and OnComplete (with the
// same id) release it as for a local one. In the approximate modes and
// KVPredict an admission with local hashes is predicted too (one without,
// from a replica that does not predict, is not). KV modes only; a
// duplicate id is an error, and so is an admission no router could have
// made: more than kvevent.MaxBlocks blocks, a prompt length that is not
// its blocks' (at this router's block size), an overlap past its blocks,
// or local hashes whose sequence hashes are not its blocks. Its size is
// what it costs the other routers, so a forged one must not be huge.
func (r *Router) AdmitRemote(id uuid.UUID, a Admission) error {
	switch {
	case r.closed.Load():
		return ErrShutdown
	case r.mode == RoundRobin:
		return errors.New("router: remote load needs a KV mode")
	}
	n, bs := len(a.Blocks), r.cfg.BlockSize
	if n > kvevent.MaxBlocks || a.ISL < n*bs || a.ISL >= (n+1)*bs || int(a.Overlap) > n {
		return fmt.Errorf("router: admission %v: %d tokens, %d blocks of %d, overlap %d do not fit", id, a.ISL, n, bs, a.Overlap)
	}
	predict := r.predict != nil && a.Local != nil
	if predict && !slices.Equal(hashing.SequenceHashes(make([]uint64, 0, n), a.Local), a.Blocks) {
		return fmt.Errorf("router: admission %v: its %d local hashes do not chain into its %d blocks", id, len(a.Local), n)
	}
	if err := r.sched.Admit(SchedRequest{ID: id, ISL: a.ISL, Blocks: a.Blocks, Overlaps: map[kvevent.Worker]uint32{a.Worker: a.Overlap}}, a.Worker); err != nil || !predict {
		return err
	}
	if err := r.predict.Predict(id, a.Worker, a.Local, a.Blocks, BlocksFor(a.ISL, 1, bs)-n); err != nil {
		_ = r.sched.Free(id)
		return r.shutdownErr(err)
	}
	return nil
}

func (r *Router) shutdownErr(err error) error {
	if errors.Is(err, shardpool.ErrClosed) {
		return ErrShutdown
	}
	return err
}

// OnFirstToken marks the request's prefill completed. It returns false in
// round-robin mode (nothing is tracked), true in KV mode; after Shutdown,
// false and ErrShutdown.
func (r *Router) OnFirstToken(id uuid.UUID) (bool, error) {
	switch {
	case r.closed.Load():
		return false, ErrShutdown
	case r.mode == RoundRobin:
		return false, nil
	}
	return true, r.sched.MarkPrefillCompleted(id)
}

// OnComplete frees the request (completed or aborted), and in the
// approximate modes releases its predicted blocks. It returns false in
// round-robin mode, true in KV modes; after Shutdown, false and
// ErrShutdown.
func (r *Router) OnComplete(id uuid.UUID) (bool, error) {
	switch {
	case r.closed.Load():
		return false, ErrShutdown
	case r.mode == RoundRobin:
		return false, nil
	}
	if r.predict != nil {
		if _, err := r.predict.Release(id); err != nil {
			return true, r.shutdownErr(err)
		}
	}
	return true, r.sched.Free(id)
}

// Flush returns once every event published before it is applied to the
// index.
func (r *Router) Flush() error {
	if r.indexer == nil {
		if r.closed.Load() {
			return ErrShutdown
		}
		return nil
	}
	_, err := r.indexer.Flush()
	return r.shutdownErr(err)
}

// Shutdown stops accepting events, applies every queued one, stops the
// indexer and the scheduler (waiting requests get ErrShutdown). Calls after
// it return ErrShutdown.
func (r *Router) Shutdown() error {
	if r.closed.Swap(true) {
		return ErrShutdown
	}
	if r.mode == RoundRobin {
		return nil
	}
	r.sched.Close()
	if r.mode == KVPredict {
		_ = r.predict.Close()
	}
	return r.indexer.Close()
}
