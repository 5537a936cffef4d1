package replay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/internal/stats"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/shardpool"
	"github.com/kvradix/kvradix/trace"
)

// Router names accepted by Run.
const (
	RoundRobin = "round_robin"
	Random     = "random"
	KV         = "kv"
	KVTemp     = "kv_temp"  // KV routing with Config.Temperature
	KVTiers    = "kv_tiers" // KV routing counting every tier (router.KVTiers)
	// KVApproxLRU routes without reading events, modelling each engine's
	// pool of ApproxCapacity × Blocks blocks (router.KVApproxLRU).
	KVApproxLRU = "kv_approx_lru"
	// KVApproxTTL routes without reading events, each routed block
	// predicted cached for ApproxTTL (router.KVApproxTTL).
	KVApproxTTL = "kv_approx_ttl"
	// KVPredict routes by events and, beside them, its own decisions of the
	// last PredictTTL (router.KVPredict).
	KVPredict = "kv_predict"
)

// Routers lists every router name.
var Routers = []string{RoundRobin, Random, KV, KVTemp, KVTiers, KVApproxLRU, KVApproxTTL, KVPredict}

// Config configures a replay.
type Config struct {
	Workers          int     // workers (16)
	DPSize           int     // data-parallel ranks per worker, one engine each (1)
	Blocks           int     // KV blocks per engine (16384)
	BlockSize        int     // tokens per block (64)
	TraceBlockSize   int     // tokens per trace hash id (trace.TraceBlockSize); see trace.Stretch
	MaxBatchedTokens int     // per step (8192)
	MaxNumSeqs       int     // per engine (256)
	Speedup          float64 // arrival times are divided by it (1)
	Seed             uint64  // tie-breaks, sampling, the random router
	Temperature      float64 // of kv_temp (0.1)
	OverlapWeight    float64 // of the KV routers' cost (router.DefaultOverlapWeight)
	QueueThreshold   float64 // of the KV routers' queue; 0: off (0)
	IndexerLanes     int     // of the KV router's indexer (2)
	// Offload gives each engine a host tier of Offload × Blocks blocks,
	// which its device evictions go to (0: none; see offload.go).
	Offload float64
	// TierWeights are kv_tiers' (router.Config.TierWeights; all zero:
	// router.DefaultTierWeights).
	TierWeights [kvevent.NumTiers]float64
	// ApproxCapacity is kv_approx_lru's idea of an engine's pool, as a
	// multiple of Blocks (1: the truth).
	ApproxCapacity float64
	// ApproxTTL is kv_approx_ttl's lifetime of a routed block, on the
	// virtual clock (0: shardpool.DefaultApproxTTL).
	ApproxTTL time.Duration
	// PredictTTL is kv_predict's lifetime of a decision (0:
	// router.DefaultPredictTTL).
	PredictTTL time.Duration
	// Replicas is how many routers of the kind named route the requests,
	// in turn (1). Each applies every engine's events to an index of its
	// own; they share their admissions (router.AdmitRemote, as package
	// cluster does) unless Isolated.
	Replicas int
	Isolated bool
}

// DefaultConfig returns the defaults named on each field.
func DefaultConfig() Config {
	return Config{Workers: 16, DPSize: 1, Blocks: 16384, BlockSize: 64, TraceBlockSize: trace.TraceBlockSize, MaxBatchedTokens: 8192, MaxNumSeqs: 256, Speedup: 1, Temperature: 0.1, OverlapWeight: router.DefaultOverlapWeight, IndexerLanes: 2, ApproxCapacity: 1, Replicas: 1}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Workers < 1:
		return fmt.Errorf("replay: workers %d, want >= 1", c.Workers)
	case c.DPSize < 1 || c.DPSize > router.MaxDPSize:
		return fmt.Errorf("replay: dp size %d, want in [1, %d]", c.DPSize, router.MaxDPSize)
	case c.Blocks < 1 || c.Blocks > MaxBlocks:
		return fmt.Errorf("replay: blocks %d, want in [1, %d]", c.Blocks, MaxBlocks)
	case c.Workers > MaxTotalBlocks/(c.DPSize*c.Blocks):
		return fmt.Errorf("replay: %d workers x %d ranks of %d blocks each, want at most %d blocks in all", c.Workers, c.DPSize, c.Blocks, MaxTotalBlocks)
	case c.BlockSize < 1 || c.BlockSize > MaxBlockSize:
		return fmt.Errorf("replay: block size %d, want in [1, %d]", c.BlockSize, MaxBlockSize)
	case c.TraceBlockSize < 1:
		return fmt.Errorf("replay: trace block size %d, want >= 1", c.TraceBlockSize)
	case c.MaxBatchedTokens < 1:
		return fmt.Errorf("replay: max batched tokens %d, want >= 1", c.MaxBatchedTokens)
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("replay: max num seqs %d, want >= 1", c.MaxNumSeqs)
	case !(c.Speedup > 0) || math.IsInf(c.Speedup, 1):
		return fmt.Errorf("replay: speedup %v, want finite and > 0", c.Speedup)
	case !(c.Temperature >= 0) || math.IsInf(c.Temperature, 1):
		return fmt.Errorf("replay: temperature %v, want finite and >= 0", c.Temperature)
	case !(c.OverlapWeight >= 0) || math.IsInf(c.OverlapWeight, 1):
		return fmt.Errorf("replay: overlap weight %v, want finite and >= 0", c.OverlapWeight)
	case !(c.QueueThreshold >= 0) || math.IsInf(c.QueueThreshold, 1):
		return fmt.Errorf("replay: queue threshold %v, want finite and >= 0", c.QueueThreshold)
	case c.IndexerLanes < 1 || c.IndexerLanes > shardpool.MaxLanes:
		return fmt.Errorf("replay: indexer lanes %d, want in [1, %d]", c.IndexerLanes, shardpool.MaxLanes)
	case !(c.Offload >= 0) || c.Offload > 1024:
		return fmt.Errorf("replay: offload %v, want in [0, 1024]", c.Offload)
	case !(c.ApproxCapacity > 0) || c.ApproxCapacity > 1024:
		return fmt.Errorf("replay: approximate capacity %v, want in (0, 1024]", c.ApproxCapacity)
	case c.ApproxTTL < 0 || c.PredictTTL < 0:
		return fmt.Errorf("replay: approximate ttl %v, predict ttl %v, want >= 0", c.ApproxTTL, c.PredictTTL)
	case c.Replicas < 1 || c.Replicas > MaxReplicas:
		return fmt.Errorf("replay: replicas %d, want in [1, %d]", c.Replicas, MaxReplicas)
	}
	for t, w := range c.TierWeights {
		if !(w >= 0) || math.IsInf(w, 1) {
			return fmt.Errorf("replay: %v tier weight %v, want finite and >= 0", kvevent.Tier(t), w)
		}
	}
	return nil
}

// Bounds of Config's fields. A mock engine's cache index is sized for its
// blocks when the engine is made (about 32 bytes a block), so the engines'
// blocks in all are bounded too: 2^27 of them take about 4 GiB before the
// replay starts.
const (
	MaxReplicas    = 64
	MaxBlocks      = 1 << 24 // an engine's KV pool, in blocks: past any GPU's
	MaxTotalBlocks = 1 << 27 // the engines' pools summed
	MaxBlockSize   = 1 << 16 // tokens a block
)

// engines is the number of mock engines: one per (worker, rank).
func (c Config) engines() int { return c.Workers * c.DPSize }

// engineOf returns engine i's worker and rank.
func (c Config) engineOf(i int) (kvevent.WorkerID, kvevent.DPRank) {
	return kvevent.WorkerID(i / c.DPSize), kvevent.DPRank(i % c.DPSize)
}

// ParseRouters splits a comma-separated list of router names.
func ParseRouters(s string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(Routers, name) {
			return nil, fmt.Errorf("unknown router %q (want %s)", name, strings.Join(Routers, ", "))
		}
		if slices.Contains(out, name) {
			return nil, fmt.Errorf("router %q given twice", name)
		}
		out = append(out, name)
	}
	return out, nil
}

// Dist summarises a latency distribution, in ms.
type Dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Summarise returns the mean and nearest-rank percentiles of xs (sorted in
// place); zero for no samples.
func Summarise(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	stats.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Dist{Mean: sum / float64(len(xs)), P50: stats.Percentile(xs, 0.50), P90: stats.Percentile(xs, 0.90), P99: stats.Percentile(xs, 0.99)}
}

// Percentiles returns the nearest-rank percentiles 0, 1, ..., 100 of xs
// (sorted in place; percentile 0 is the minimum); nil for no samples.
func Percentiles(xs []float64) []float64 {
	if len(xs) == 0 {
		return nil
	}
	stats.Sort(xs)
	out := make([]float64, 101)
	for p := range out {
		out[p] = stats.Percentile(xs, float64(p)/100)
	}
	return out
}

// Spread describes how requests spread over the workers.
type Spread struct {
	Min  int     `json:"min"`
	Max  int     `json:"max"`
	Mean float64 `json:"mean"`
	CV   float64 `json:"cv"` // coefficient of variation
}

// Result is one router's replay.
type Result struct {
	Router    string `json:"router"`
	Requests  int    `json:"requests"`
	Completed int    `json:"completed"`
	Rejected  int    `json:"rejected"` // larger than an engine's whole pool
	Queued    int    `json:"queued"`   // held back by the router's queue at arrival
	// ReuseRatio is the share of prompt tokens not computed: found in the
	// device's prefix cache, or loaded back from the host tier.
	ReuseRatio float64 `json:"reuse_ratio"`
	// ReuseByTier splits ReuseRatio by the tier the tokens came from.
	ReuseByTier TierShares `json:"reuse_by_tier"`
	// RoutingEfficiency is ReuseRatio over the pooled reference's reuse
	// (see References); set by Compare and Sweep.
	RoutingEfficiency float64 `json:"routing_efficiency"`
	PromptTokens      int64   `json:"prompt_tokens"`
	CachedTokens      int64   `json:"cached_tokens"`           // found on the device
	LoadedTokens      int64   `json:"loaded_tokens,omitempty"` // loaded back from the host
	OutputTokens      int64   `json:"output_tokens"`
	TTFT              Dist    `json:"ttft_ms"`
	// TTFTPercentiles holds the TTFT's percentiles 0, 1, ..., 100 (ms), the
	// distribution's CDF.
	TTFTPercentiles []float64 `json:"ttft_percentiles_ms"`
	TPOT            Dist      `json:"tpot_ms"`
	ITL             Dist      `json:"itl_ms"`
	E2E             Dist      `json:"e2e_ms"`
	ThroughputRPS   float64   `json:"throughput_rps"`
	ThroughputTPS   float64   `json:"throughput_tps"` // output tokens per second
	MakespanMs      float64   `json:"makespan_ms"`
	Load            Spread    `json:"load"`
	RejectedEvents  uint64    `json:"rejected_events"` // by the KV indexer
	UnpublishedEvts int       `json:"unpublished_events"`
	// ApproxPrecision is, of the cached tokens the router counted on the
	// worker it chose (its index's overlap there), the share the engine
	// really had cached when it admitted the request and looked its prompt
	// up, averaged over the requests with a predicted overlap;
	// ApproxRecall is, of the tokens the engine really had then, the share
	// the router counted, averaged over the requests whose engine had any.
	// Overlaps are leading blocks, so a request's shared part is the lesser
	// of the two. Absent for routers without an index (round_robin,
	// random).
	ApproxPrecision *float64 `json:"approx_precision,omitempty"`
	ApproxRecall    *float64 `json:"approx_recall,omitempty"`
}

// TierShares are shares of prompt tokens by the tier they were served
// from (the mock engines have a device and a host tier; disk and external
// stay 0).
type TierShares struct {
	Device     float64 `json:"device"`
	HostPinned float64 `json:"host_pinned"`
	Disk       float64 `json:"disk"`
	External   float64 `json:"external"`
}

// policy is what the simulation asks where requests go and where engines
// publish: a router under test, or a recorder of the workload.
type policy interface {
	// choose returns the worker of request i.
	choose(i int, req router.Request, local []uint64) (int, error)
	// predicted returns the blocks the router counted cached on the
	// worker of its latest choice; false if it counts none.
	predicted() (uint32, bool)
	sink(w kvevent.WorkerID) router.EventSink
	firstToken(id uuid.UUID) error
	complete(id uuid.UUID) error
}

// routerPolicy drives kvradix routers, Config.Replicas of them alike taking
// the requests in turn (or picks at random).
type routerPolicy struct {
	rs       []*router.Router
	isolated bool                         // the replicas do not share admissions
	owner    map[uuid.UUID]*router.Router // isolated: each request's replica
	turn     int
	rng      *rand.Rand      // the random router
	done     context.Context // cancelled: SelectWorker never waits
	clock    *float64        // the simulation's, ms
	overlap  uint32          // the chosen worker's, in the latest admission
	err      error           // a replica's refusal of another's admission
}

func newRouterPolicy(name string, cfg Config) (*routerPolicy, error) {
	rc := router.DefaultConfig()
	rc.BlockSize, rc.Seed, rc.IndexerLanes, rc.MaxBatchedTokens = cfg.BlockSize, cfg.Seed, cfg.IndexerLanes, cfg.MaxBatchedTokens
	rc.OverlapWeight, rc.QueueThreshold, rc.DPSize = cfg.OverlapWeight, cfg.QueueThreshold, cfg.DPSize
	mode := router.RoundRobin
	p := &routerPolicy{}
	switch name {
	case RoundRobin:
	case Random:
		p.rng = rand.New(rand.NewPCG(cfg.Seed, 0x72616e646f6d))
	case KV:
		mode = router.KV
	case KVTemp:
		mode, rc.Temperature = router.KV, cfg.Temperature
	case KVTiers:
		mode, rc.TierWeights = router.KVTiers, cfg.TierWeights
	case KVApproxLRU, KVApproxTTL, KVPredict:
		mode, _ = router.ParseMode(name)
		rc.ApproxCapacity = max(1, int(cfg.ApproxCapacity*float64(cfg.Blocks)))
		rc.ApproxTTL, rc.PredictTTL = cfg.ApproxTTL, cfg.PredictTTL
		rc.Now = p.now
	default:
		return nil, fmt.Errorf("replay: unknown router %q", name)
	}
	p.isolated = cfg.Isolated && cfg.Replicas > 1
	if p.isolated {
		p.owner = map[uuid.UUID]*router.Router{}
	}
	for k := range max(cfg.Replicas, 1) {
		rc.OnAdmit = func(id uuid.UUID, a router.Admission) { p.admitted(k, id, a) }
		r, err := router.New(mode, rc, cfg.Workers)
		if err != nil {
			p.shutdown()
			return nil, err
		}
		p.rs = append(p.rs, r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.done = ctx
	return p, nil
}

// admitted hears replica k's admission: the overlap it counted, and,
// shared, the other replicas' AdmitRemote.
func (p *routerPolicy) admitted(k int, id uuid.UUID, a router.Admission) {
	p.overlap = a.Overlap
	if p.isolated {
		p.owner[id] = p.rs[k]
		return
	}
	for j, r := range p.rs {
		if j == k {
			continue
		}
		if err := r.AdmitRemote(id, a); err != nil && p.err == nil {
			p.err = fmt.Errorf("replica %d refused replica %d's admission: %w", j, k, err)
		}
	}
}

// replicasOf returns the replicas that know request id (and, isolated,
// forgets it when it completes).
func (p *routerPolicy) replicasOf(id uuid.UUID, complete bool) []*router.Router {
	if !p.isolated {
		return p.rs
	}
	r, ok := p.owner[id]
	if !ok {
		return nil // never admitted: round robin
	}
	if complete {
		delete(p.owner, id)
	}
	return []*router.Router{r}
}

// shutdown stops every replica.
func (p *routerPolicy) shutdown() {
	for _, r := range p.rs {
		_ = r.Shutdown()
	}
}

// setClock makes the router's predictions age on the simulation's clock.
func (p *routerPolicy) setClock(ms *float64) { p.clock = ms }

// now is the virtual clock as a time (the epoch until the simulation
// starts).
func (p *routerPolicy) now() time.Time {
	if p.clock == nil {
		return time.Unix(0, 0)
	}
	return time.Unix(0, int64(*p.clock*float64(time.Millisecond)))
}

func (p *routerPolicy) predicted() (uint32, bool) {
	return p.overlap, p.rng == nil && p.rs[0].Mode() != router.RoundRobin
}

// errQueued is choose's answer when the router holds the request back.
var errQueued = errors.New("replay: queued by the router")

// choose asks the router. The call must not block the virtual clock, so it
// passes a cancelled context: a router that would queue the request returns
// at once, and the simulation holds the request and asks again after the
// next step ends (the router's queue, on the virtual clock).
func (p *routerPolicy) choose(_ int, req router.Request, _ []uint64) (int, error) {
	dp := p.rs[0].DPSize()
	if p.rng != nil {
		return p.rng.IntN(p.rs[0].Workers() * dp), nil
	}
	// Apply every event published so far, so decisions do not depend on
	// goroutine timing: the replay is deterministic.
	for _, r := range p.rs {
		if err := r.Flush(); err != nil {
			return 0, err
		}
	}
	r := p.rs[p.turn%len(p.rs)]
	p.turn++
	w, err := r.SelectWorkerRank(p.done, req)
	if errors.Is(err, context.Canceled) {
		return 0, errQueued
	}
	if err == nil {
		err = p.err
	}
	return int(w.ID)*dp + int(w.DPRank), err
}

func (p *routerPolicy) sink(w kvevent.WorkerID) router.EventSink {
	if len(p.rs) == 1 {
		return p.rs[0].Sink(w)
	}
	sinks := make(fanout, len(p.rs))
	for k, r := range p.rs {
		sinks[k] = r.Sink(w)
	}
	return sinks
}

// fanout publishes every event to each replica's sink.
type fanout []router.EventSink

func (f fanout) Publish(ev kvevent.Event) error { return f.PublishWithTier(ev, kvevent.TierDevice) }

func (f fanout) PublishWithTier(ev kvevent.Event, tier kvevent.Tier) error {
	var first error
	for _, s := range f {
		if err := s.PublishWithTier(ev, tier); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (p *routerPolicy) firstToken(id uuid.UUID) error {
	for _, r := range p.replicasOf(id, false) {
		if _, err := r.OnFirstToken(id); err != nil {
			return err
		}
	}
	return nil
}

func (p *routerPolicy) complete(id uuid.UUID) error {
	for _, r := range p.replicasOf(id, true) {
		if _, err := r.OnComplete(id); err != nil {
			return err
		}
	}
	return nil
}

// sim is one replay on the virtual clock.
type sim struct {
	cfg     Config
	prompts *prompts
	pol     policy
	engines []*engine
	reqs    []*request
	events  eventHeap
	seq     uint64
	now     float64
	perW    []int
	queue   []queued // requests the router holds back

	ttft, tpot, itl, e2e []float64
	precision, recall    accuracy
	completed            int
	prompt, cached, out  int64
	loaded               int64 // prompt tokens loaded back from the host tier
	err                  error
}

type simEvent struct {
	t    float64
	seq  uint64 // ties in time break by insertion order
	kind uint8  // evArrival or evStepEnd
	idx  int    // request (arrival) or engine (step end)
}

const (
	evArrival uint8 = iota
	evStepEnd
)

// eventHeap is a binary min-heap of events by (time, insertion order),
// typed: container/heap boxed every event pushed and popped (70% of a
// replay's allocations).
type eventHeap []simEvent

func (h eventHeap) less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(ev simEvent) {
	*h = append(*h, ev)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *eventHeap) pop() simEvent {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q = q[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && q.less(l, m) {
			m = l
		}
		if r := l + 1; r < n && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

func (s *sim) push(t float64, kind uint8, idx int) {
	s.seq++
	s.events.push(simEvent{t: t, seq: s.seq, kind: kind, idx: idx})
}

// Run replays reqs on a fresh fleet routed by the named router.
func Run(reqs []trace.Request, routerName string, cfg Config) (Result, error) {
	return RunContext(context.Background(), reqs, routerName, cfg)
}

// RunContext is Run, returning ctx's error soon after ctx ends.
func RunContext(ctx context.Context, reqs []trace.Request, routerName string, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	p := startPrompts(ctx, reqs, cfg)
	defer p.close()
	return runPrompts(ctx, reqs, p, routerName, cfg)
}

// runPrompts is RunContext over prompts hashed already.
func runPrompts(ctx context.Context, reqs []trace.Request, p *prompts, routerName string, cfg Config) (Result, error) {
	pol, err := newRouterPolicy(routerName, cfg)
	if err != nil {
		return Result{}, err
	}
	defer pol.shutdown()
	res := Result{Router: routerName, Requests: len(reqs)}
	s, err := simulate(ctx, reqs, p, cfg, pol, &res)
	if err != nil {
		return res, err
	}
	if pol.rs[0].Mode() != router.RoundRobin {
		for _, r := range pol.rs {
			if err := r.Flush(); err != nil {
				return res, err
			}
			res.RejectedEvents += r.Stats().Index.Rejected()
		}
	}
	s.report(&res)
	return res, nil
}

// Policy is a router under test from outside this package (several router
// replicas, say): where each request goes, and where each worker's engines
// publish. Choose may return ErrQueued to hold a request back. The
// simulation is single-threaded: calls never overlap.
type Policy interface {
	// Choose returns the engine of request i (worker·DPSize + rank).
	Choose(i int, req router.Request) (int, error)
	// Sink is where worker w's engines publish their KV events.
	Sink(w kvevent.WorkerID) router.EventSink
	FirstToken(id uuid.UUID) error
	Complete(id uuid.UUID) error
}

// ErrQueued is Policy.Choose's answer for a request the router holds back.
var ErrQueued = errQueued

// RunPolicy replays reqs through p, as Run does through a named router.
func RunPolicy(ctx context.Context, reqs []trace.Request, name string, cfg Config, p Policy) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	prompts := startPrompts(ctx, reqs, cfg)
	defer prompts.close()
	res := Result{Router: name, Requests: len(reqs)}
	s, err := simulate(ctx, reqs, prompts, cfg, exported{p}, &res)
	if err != nil {
		return res, err
	}
	s.report(&res)
	return res, nil
}

// exported adapts a Policy to the simulation's policy.
type exported struct{ p Policy }

func (e exported) choose(i int, req router.Request, _ []uint64) (int, error) {
	return e.p.Choose(i, req)
}
func (e exported) predicted() (uint32, bool)                { return 0, false }
func (e exported) sink(w kvevent.WorkerID) router.EventSink { return e.p.Sink(w) }
func (e exported) firstToken(id uuid.UUID) error            { return e.p.FirstToken(id) }
func (e exported) complete(id uuid.UUID) error              { return e.p.Complete(id) }

// simulate runs the event loop to the end, over reqs's prompts hashed
// for cfg.
func simulate(ctx context.Context, reqs []trace.Request, p *prompts, cfg Config, pol policy, res *Result) (*sim, error) {
	if !p.fits(cfg) {
		return nil, errors.New("replay: prompts hashed for other block sizes")
	}
	s := &sim{cfg: cfg, pol: pol, perW: make([]int, cfg.engines()), prompts: p}
	s.presize(reqs)
	if c, ok := pol.(interface{ setClock(*float64) }); ok {
		c.setClock(&s.now)
	}
	ec := EngineConfig{Blocks: cfg.Blocks, BlockSize: cfg.BlockSize, MaxBatchedTokens: cfg.MaxBatchedTokens, MaxNumSeqs: cfg.MaxNumSeqs,
		HostBlocks: int(cfg.Offload * float64(cfg.Blocks))}
	for i := range cfg.engines() {
		w, rank := cfg.engineOf(i)
		s.engines = append(s.engines, newEngine(i, rank, ec, pol.sink(w)))
	}
	s.reqs = make([]*request, len(reqs))
	for i, tr := range reqs {
		s.push(tr.Timestamp/cfg.Speedup, evArrival, i)
	}
	for n := 0; len(s.events) > 0 && s.err == nil; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return s, ctx.Err()
		}
		ev := s.events.pop()
		s.now = ev.t
		switch ev.kind {
		case evArrival:
			s.arrive(ev.idx, reqs[ev.idx], res)
		case evStepEnd:
			e := s.engines[ev.idx]
			e.finishStep(s.now, s)
			s.startStep(e)
			s.drainQueue()
		}
	}
	for _, e := range s.engines {
		res.UnpublishedEvts += e.sinkErrs
	}
	if s.err == nil && len(s.queue) > 0 {
		s.err = fmt.Errorf("replay: %d requests still queued by the router after the last step", len(s.queue))
	}
	return s, s.err
}

func (s *sim) arrive(i int, tr trace.Request, res *Result) {
	var id uuid.UUID
	binary.BigEndian.PutUint64(id[8:], uint64(i)+1)
	if err := s.prompts.wait(i); err != nil {
		s.err = err
		return
	}
	local, seq := s.prompts.local[i], s.prompts.seq[i]
	r := &request{id: id, arrival: s.now, isl: tr.InputLength, osl: tr.OutputLength, local: local, seq: seq}
	s.reqs[i] = r
	if router.BlocksFor(r.isl, r.osl, s.cfg.BlockSize) > s.cfg.Blocks {
		res.Rejected++
		return
	}
	q := queued{i: i, req: router.Request{UUID: id, Local: local, PromptTokens: s.prompts.tokens[i], MaxOutputTokens: tr.OutputLength}}
	if len(s.queue) > 0 || !s.route(q) {
		s.queue = append(s.queue, q)
		res.Queued++
	}
}

// presize gives the distributions the room the trace's requests can fill,
// at most: one TTFT, TPOT and end-to-end latency a request, an inter-token
// gap per output token after the first. Growing a 4M-gap slice by doubling
// cost a third of a replay (copies, and page faults on fresh memory).
func (s *sim) presize(reqs []trace.Request) {
	gaps := 0
	for _, tr := range reqs {
		if router.BlocksFor(tr.InputLength, tr.OutputLength, s.cfg.BlockSize) <= s.cfg.Blocks { // the rest are rejected
			gaps += max(tr.OutputLength-1, 0)
		}
	}
	s.ttft, s.tpot, s.e2e = make([]float64, 0, len(reqs)), make([]float64, 0, len(reqs)), make([]float64, 0, len(reqs))
	s.itl = make([]float64, 0, gaps)
}

// queued is a request the router holds back (every worker busy).
type queued struct {
	i   int
	req router.Request
}

// route asks the policy for q's worker and hands the request to it; false
// if the router queues it.
func (s *sim) route(q queued) bool {
	r := s.reqs[q.i]
	w, err := s.pol.choose(q.i, q.req, r.local)
	if errors.Is(err, errQueued) {
		return false
	}
	if err != nil {
		s.err = fmt.Errorf("request %d: %w", q.i, err)
		return true
	}
	s.perW[w]++
	e := s.engines[w]
	r.predicted, r.predicts = s.pol.predicted()
	e.waiting = append(e.waiting, r)
	if !e.busy {
		s.startStep(e)
	}
	return true
}

// drainQueue routes queued requests, in FIFO order, while the router
// admits them.
func (s *sim) drainQueue() {
	n := 0
	for n < len(s.queue) && s.route(s.queue[n]) {
		n++
	}
	s.queue = s.queue[n:]
}

func (s *sim) startStep(e *engine) {
	d, ok := e.step()
	e.busy = ok
	if ok {
		s.push(s.now+d, evStepEnd, e.id)
	}
}

func (s *sim) firstToken(r *request) {
	s.ttft = append(s.ttft, r.first-r.arrival)
	s.prompt += int64(r.isl)
	s.cached += int64(r.hits * s.cfg.BlockSize)
	s.loaded += int64(r.loaded * s.cfg.BlockSize)
	if r.predicts {
		s.precision.add(min(r.predicted, r.held), r.predicted)
		s.recall.add(min(r.predicted, r.held), r.held)
	}
	if err := s.pol.firstToken(r.id); err != nil && s.err == nil {
		s.err = err
	}
}

func (s *sim) token(gap float64) { s.itl = append(s.itl, gap) }

func (s *sim) done(r *request) {
	s.completed++
	s.out += int64(r.tokens)
	s.e2e = append(s.e2e, r.last-r.arrival)
	if r.tokens > 1 {
		s.tpot = append(s.tpot, (r.last-r.first)/float64(r.tokens-1))
	}
	if err := s.pol.complete(r.id); err != nil && s.err == nil {
		s.err = err
	}
}

func (s *sim) report(res *Result) {
	res.Completed = s.completed
	res.PromptTokens, res.CachedTokens, res.LoadedTokens, res.OutputTokens = s.prompt, s.cached, s.loaded, s.out
	if s.prompt > 0 {
		res.ReuseRatio = float64(s.cached+s.loaded) / float64(s.prompt)
		res.ReuseByTier = TierShares{Device: float64(s.cached) / float64(s.prompt), HostPinned: float64(s.loaded) / float64(s.prompt)}
	}
	res.TTFT, res.TPOT, res.ITL, res.E2E = Summarise(s.ttft), Summarise(s.tpot), Summarise(s.itl), Summarise(s.e2e)
	res.TTFTPercentiles = Percentiles(s.ttft)
	res.MakespanMs = s.now
	if s.now > 0 {
		res.ThroughputRPS = float64(s.completed) / (s.now / 1000)
		res.ThroughputTPS = float64(s.out) / (s.now / 1000)
	}
	res.Load = SpreadOf(s.perW)
	res.ApproxPrecision, res.ApproxRecall = s.precision.mean(), s.recall.mean()
}

// accuracy averages a share (part over whole) over the requests with a
// whole.
type accuracy struct {
	sum float64
	n   int
}

func (a *accuracy) add(part, whole uint32) {
	if whole > 0 {
		a.sum += float64(part) / float64(whole)
		a.n++
	}
}

// mean is the average share; nil if no request had a whole.
func (a *accuracy) mean() *float64 {
	if a.n == 0 {
		return nil
	}
	m := a.sum / float64(a.n)
	return &m
}

// SpreadOf describes how counts (per worker) spread.
func SpreadOf(xs []int) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	sp := Spread{Min: slices.Min(xs), Max: slices.Max(xs)}
	sum := 0.0
	for _, x := range xs {
		sum += float64(x)
	}
	sp.Mean = sum / float64(len(xs))
	if sp.Mean > 0 {
		v := 0.0
		for _, x := range xs {
			d := float64(x) - sp.Mean
			v += d * d
		}
		sp.CV = math.Sqrt(v/float64(len(xs))) / sp.Mean
	}
	return sp
}
