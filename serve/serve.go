// Package serve is kvradix's index as an HTTP service, on the API of
// Dynamo's current standalone KV indexer (lib/kv-router/src/services/
// indexer/server.rs; Mooncake's KV Indexer RFC conventions): engines are
// registered with their ZeroMQ KV event endpoints, and routers in any
// language ask which instance holds how much of a prompt. Deliberate
// differences: a bearer token for what changes state, loopback by
// default, /route and the request lifecycle, tree_sizes and tier_scores
// in the answers.
//
// One index (a shardpool.Pool over a CompressedTree) is kept per (model,
// tenant); its first registration sets its block size. Each registered
// (instance, data-parallel rank) has a vllm.Subscriber of its own, with its
// gap repair and its guards against hostile peers.
//
//	POST /register        {instance_id, endpoint, model_name, block_size, tenant_id?, dp_rank?, replay_endpoint?, total_kv_blocks?, type?}
//	POST /unregister      {instance_id, model_name, tenant_id?, dp_rank?}
//	GET  /workers         [{instance_id, endpoints: {"<rank>": endpoint}}]
//	POST /query           {token_ids, model_name, tenant_id?, lora_name?, cache_salt?}
//	POST /query_by_hash   {block_hashes, model_name, tenant_id?} (a cache_salt is refused: the hashes carry it)
//	GET  /dump            {"<model>:<routing_group>": {"block_size": N, "events": [RouterEvent, ...]}}
//	POST /route           {token_ids | block_hashes, model_name, tenant_id?, request_id?} (see route.go)
//	POST /requests/{id}/first_token, /requests/{id}/complete
//	POST /register_peer   {url}; POST /deregister_peer {url}; GET /peers (see peers.go)
//	GET  /health
//	GET  /ready           200 once the saved state is recovered and every engine is caught up or failed, else 503 saying why
//	GET  /metrics         Prometheus: events, gaps and losses per engine, query and route latency, hit rate, routes per instance, saves
//
// Queries answer {"scores": {"<instance>": {"<rank>": matched tokens}},
// "frequencies": [workers holding block i, ...], "instances": {"<instance>":
// {"longest_matched", "gpu", "dp": {"<rank>": tokens}, "cpu", "disk"}},
// "tree_sizes": {"<instance>": {"<rank>": blocks}}} (see Scores). A
// registration answers 201 {"status": "ok"}, an unregistration 200
// {"status": "ok"}. Errors are {"error": "..."}, naming the field, with
// Dynamo's statuses: 400 for a body that is not JSON or a value out of
// range, 413 for a body over the limit, 415 without a JSON content type,
// 422 for JSON of the wrong shape (a wrong type, a required field
// missing), 404 for no index of the model and routing group ("no indexer
// for model=M routing_group=G"); kvradix's own: 409 for a block size other
// than the model's or an instance registered twice. A registration never
// waits on its engine (see Register).
//
// With Config.StateDir the registry and the indexes are saved (on Close and
// every Config.SaveEvery) and recovered (Recover). On a NATS bus
// (NewOnBus), replicas of the service serve the same indexes (see bus.go).
//
// All methods are safe for concurrent use.
package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/cluster"
	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/shardpool"
)

// Config configures a Service.
type Config struct {
	Lanes        int   // lanes of each model's index (2; at most MaxLanes)
	MaxBodyBytes int64 // the largest request body (8 MiB; MinBodyBytes to MaxBodyCap)
	MaxTokens    int   // the most token ids or block hashes a query may carry (1M)
	// RequestTTL is how long a routed request counts in its instance's
	// load without being completed (10 min): a client that crashed cannot
	// pin load for good. At least MinRequestTTL.
	RequestTTL time.Duration
	// MaxRoutedBlocks bounds what the requests in flight (routed, not yet
	// completed or expired) hold together, in blocks: each counts its
	// prompt's blocks and RouteOverheadBlocks more for itself (16M, some
	// 2.6 GB, about 160 bytes a block; at most MaxRoutedBlocksCap). The
	// scheduler keeps every block of a request in flight, so clients that
	// route and never complete could otherwise make it hold any number
	// until their TTL. A route past it is refused (503).
	MaxRoutedBlocks int
	// MaxIndexes bounds the indexes (one per model and routing group) that
	// registrations may create (256): each takes a few MB (2.3 grown, more
	// sized by IndexBlocks) and two goroutines, so a client registering
	// under ever new names could otherwise exhaust memory. MaxInstances
	// bounds the engines registered, an instance's rank each (16384; about
	// 33 KB each without events, a subscriber's goroutines and buffers with
	// them). A registration past either is refused (503) until some leave.
	MaxIndexes, MaxInstances int
	// HoldWhileRecovering, for a service that serves while it recovers
	// (StateDir or Peers set; kvradix serve), answers 503 until Recover has
	// run to every endpoint that changes the state (a registration, a route
	// or a release would race the state being restored) and to /dump (a
	// peer restoring from it would take a part for the whole). Queries
	// answer what is back so far.
	HoldWhileRecovering bool
	// PeerIdleTimeout abandons a peer's dump (Peers) that stops for this
	// long midway (30 s): a peer gone silent is left for the next in a
	// moment, not at the dump's whole bound (5 minutes, or the peer's own
	// time to write a dump of the length it gives, if longer).
	PeerIdleTimeout time.Duration
	// StateDir, if set, is where Close saves the registry and every index,
	// and Recover reads them back (see Recover).
	StateDir string
	// SaveEvery, with StateDir, also saves the state this often while
	// serving (see Save), at most once every MinSaveEvery; 0 saves on
	// Close only.
	SaveEvery time.Duration
	// OnSaveError, if set, hears the periodic saves' errors (a failed save
	// leaves the previous one in place, and the next tick tries again).
	OnSaveError func(error)
	// Token, if set, is the bearer token /register and /unregister require
	// (Authorization: Bearer <token>); queries stay open.
	Token string
	// Subscriber configures every engine's subscriber (its BlockSize is the
	// model's).
	Subscriber vllm.SubscriberConfig
	// Tiers keeps every tier (shardpool.NewPoolTiers): events of the host,
	// disk and external tiers are indexed, queries answer tier_scores
	// beside the device's scores, and /route weighs each cached block by
	// its tier (router.DefaultTierWeights). Without it, other tiers'
	// events are counted and dropped (the seed's rule).
	Tiers bool
	// IndexBlocks, if set, sizes each model's index up front for this many
	// blocks: the engines' KV pools summed (vLLM's num_gpu_blocks, Dynamo's
	// total_kv_blocks). Filling it that far, the index's table of engine
	// hashes moves no entry and faults in no page, and stores take about a
	// quarter of the time they take in an index grown as it fills (the
	// default, 0). The table takes 8 bytes a slot at a load of 0.7, and the
	// index makes resident 16 bytes of heap a block for its runs, at its
	// creation, each capped at 512 MiB (see radix.NewCompressedTreeSized);
	// past the size, the index grows as usual. At most MaxIndexBlocks.
	// Engines that publish events and register with total_kv_blocks size
	// their model's index further, for their pools summed, where that is
	// more (see index.reserve).
	IndexBlocks int
	// Peers are other services indexing the same engines (http(s) URLs):
	// Recover restores an empty service from the first whose GET /dump
	// answers (see peers.go). POST /register_peer adds more.
	Peers []string
	// EventsStaleAfter, if set, routes an engine registered with
	// total_kv_blocks on its model's predictions while no message of its
	// has come for this long (see approx.go); 0 never does.
	EventsStaleAfter time.Duration
	// PredictTTL, if set, has /route count every decision for this long
	// beside the events, merged by max (router.KVPredict's way): a burst of
	// requests sharing a prefix follows the first before its blocks are
	// stored (see approx.go); 0 does not.
	PredictTTL time.Duration
}

// Bounds of Config's fields: New floors or caps a field past them (a
// zero field takes its default), and the command refuses such a flag.
const (
	MaxLanes = shardpool.MaxLanes
	// MaxIndexBlocks bounds Config.IndexBlocks: 2^26 blocks, past which
	// the sizing's caps hold anyway.
	MaxIndexBlocks = 1 << 26
	MinBodyBytes   = 4 << 10
	// MaxBodyCap bounds Config.MaxBodyBytes: 1 GiB, past a query of
	// MaxTokens hashes many times over, and what one request may make the
	// service buffer.
	MaxBodyCap    = 1 << 30
	MinRequestTTL = time.Second
	MinSaveEvery  = 10 * time.Millisecond
	// MaxRoutedBlocksCap bounds Config.MaxRoutedBlocks: 2^28 blocks, some
	// 40 GB of requests in flight.
	MaxRoutedBlocksCap = 1 << 28
	// RouteOverheadBlocks is what a request in flight counts against
	// Config.MaxRoutedBlocks beyond its prompt's blocks: keeping one (its
	// id, its deadline, the scheduler's entry) costs about what 4 blocks do.
	RouteOverheadBlocks = 4
)

func (c *Config) defaults() {
	if c.Lanes <= 0 {
		c.Lanes = 2
	}
	c.Lanes = min(c.Lanes, MaxLanes)
	c.IndexBlocks = min(max(c.IndexBlocks, 0), MaxIndexBlocks)
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 8 << 20
	}
	c.MaxBodyBytes = min(max(c.MaxBodyBytes, MinBodyBytes), MaxBodyCap)
	if c.MaxTokens <= 0 {
		c.MaxTokens = 1 << 20
	}
	if c.RequestTTL <= 0 {
		c.RequestTTL = 10 * time.Minute
	}
	c.RequestTTL = max(c.RequestTTL, MinRequestTTL)
	if c.MaxRoutedBlocks <= 0 {
		c.MaxRoutedBlocks = 1 << 24
	}
	c.MaxRoutedBlocks = min(c.MaxRoutedBlocks, MaxRoutedBlocksCap)
	if c.MaxIndexes <= 0 {
		c.MaxIndexes = 256
	}
	if c.PeerIdleTimeout <= 0 {
		c.PeerIdleTimeout = 30 * time.Second
	}
	if c.MaxInstances <= 0 {
		c.MaxInstances = 1 << 14
	}
	if c.SaveEvery < 0 {
		c.SaveEvery = 0
	}
	if c.SaveEvery > 0 {
		c.SaveEvery = max(c.SaveEvery, MinSaveEvery)
	}
}

// DefaultTenant is the tenant of requests that name none.
const DefaultTenant = "default"

// Errors the API maps to statuses.
var (
	ErrInvalid      = errors.New("invalid request")
	ErrUnknownModel = errors.New("unknown model")
	ErrConflict     = errors.New("conflict")
	ErrUnreachable  = errors.New("endpoint cannot be subscribed to")
	ErrUnknownPeer  = errors.New("peer not found")
	// ErrFull is a registration, peer or route past one of the service's
	// bounds (503), and ErrClosed any change asked of a service closing.
	ErrFull   = errors.New("full")
	ErrClosed = errors.New("service closed")
)

// modelKey names one index.
type modelKey struct{ model, tenant string }

// String is "model:tenant", the index's name in /dump and the metrics (a
// tenant holds no ':', so names never collide).
func (k modelKey) String() string { return k.model + ":" + k.tenant }

// instanceKey names one registered engine.
type instanceKey struct {
	modelKey
	instance kvevent.WorkerID
	rank     int
}

type index struct {
	pool      *shardpool.Pool
	pred      *predictions // the engines registered with total_kv_blocks (approx.go)
	blockSize int
	tiers     bool // the pool keeps every tier
	router    *modelRouter
	// sink takes the engines' events: the pool, or on a bus (NewOnBus)
	// the model's stream, which replica follows into the pool.
	sink    vllm.Sink
	bus     *cluster.Bus
	replica *cluster.Replica
}

// settle returns once the index has applied every event taken so far (on
// a bus: every event the stream holds).
func (idx *index) settle(ctx context.Context) error {
	if idx.replica != nil {
		if err := idx.replica.CatchUp(ctx); err != nil {
			return err
		}
	}
	_, err := idx.pool.Flush()
	return err
}

// close stops the index (and its following of the bus).
func (idx *index) close() error {
	if idx.replica != nil {
		idx.replica.Close()
		idx.bus.Close()
	}
	idx.pred.close()
	return idx.pool.Close()
}

type instance struct {
	reg   Registration
	sub   *vllm.Subscriber // nil for an engine without events
	since time.Time        // when it was subscribed to (or registered, without events)
}

// worker is the instance's (instance, rank) in its model's index.
func (k instanceKey) worker() kvevent.Worker {
	return kvevent.Worker{ID: k.instance, DPRank: kvevent.DPRank(k.rank)}
}

// Service is the index service: the registry of engines and their
// indexes. Serve its Handler.
type Service struct {
	cfg     Config
	metrics *metrics
	ctx     context.Context // ends at Close: stops the background work
	cancel  context.CancelFunc
	bg      sync.WaitGroup // expire and the periodic saves

	// regMu serialises the registry's changes, the saves and Close; it is
	// taken before mu. The maps are written holding both, and read holding
	// either.
	regMu sync.Mutex
	gen   uint64 // the last saved state's generation (regMu)

	mu        sync.Mutex
	indexes   map[modelKey]*index
	instances map[instanceKey]*instance
	dumping   chan struct{}         // one /dump at a time
	large     chan struct{}         // slots of requests with large bodies (see bounded)
	pending   map[instanceKey]*dial // registered, their engines being dialled
	dialing   sync.WaitGroup        // the dials of pending instances
	routes    map[uuid.UUID]*route  // requests in flight, by routeKey
	routed    int                   // the blocks they hold (route.blocks summed)
	peers     []string              // see peers.go
	expiries  []expiry              // their deadlines, soonest first (see expire)
	closed    bool

	// recovering, with Config.StateDir, until Recover has run: the
	// service is not ready (Ready) before.
	recovering atomic.Bool

	bus *bus // NewOnBus's
}

// New returns an empty service.
func New(cfg Config) *Service {
	cfg.defaults()
	s := &Service{cfg: cfg, indexes: map[modelKey]*index{}, instances: map[instanceKey]*instance{},
		pending: map[instanceKey]*dial{}, routes: map[uuid.UUID]*route{}, dumping: make(chan struct{}, 1), large: make(chan struct{}, largeBodies)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.recovering.Store(cfg.StateDir != "" || len(cfg.Peers) > 0)
	for _, p := range cfg.Peers {
		_ = s.RegisterPeer(p) // one it refuses is left out (see CheckPeer)
	}
	s.metrics = newMetrics(s)
	s.bg.Go(s.expire)
	if cfg.StateDir != "" && cfg.SaveEvery > 0 {
		s.bg.Go(s.saveEvery)
	}
	return s
}

// Registration is a POST /register body.
type Registration struct {
	InstanceID     uint64 `json:"instance_id"`
	Endpoint       string `json:"endpoint"`
	ModelName      string `json:"model_name"`
	BlockSize      int    `json:"block_size"`
	TenantID       string `json:"tenant_id,omitempty"`
	RoutingGroup   string `json:"routing_group,omitempty"` // Dynamo's name of the partition; tenant_id is its synonym
	DPRank         int    `json:"dp_rank,omitempty"`
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	// TotalKVBlocks is the engine's KV pool in blocks (vLLM's
	// num_gpu_blocks, Dynamo's total_kv_blocks). With it the service models
	// the engine's cache from the requests it routes there (approx.go);
	// with it and no endpoint, the engine publishes no events and is
	// routed on that model alone. With an endpoint, it sizes the model's
	// index too, for the pools of its engines summed (see index.reserve).
	TotalKVBlocks int `json:"total_kv_blocks,omitempty"`
	// Type is the engine's kind, where the caller says: one of
	// EngineTypes. The subscriber needs none to decode: vLLM's, SGLang's
	// and RFC #1527's (Mooncake's) shapes each tell themselves apart by
	// their own keys and types (ingest/vllm). It is checked, kept and
	// shown in /workers.
	Type string `json:"type,omitempty"`
}

// EngineTypes are the registration types the service knows.
var EngineTypes = []string{"vllm", "sglang", "mooncake"}

// MaxKVBlocks bounds Registration.TotalKVBlocks: past any engine's pool
// (an H200's 141 GB hold a few million blocks), and what the model of
// one engine's cache may come to hold (about 100 bytes a block).
const MaxKVBlocks = 1 << 24

func (x *Registration) partition() (*string, string) { return &x.TenantID, x.RoutingGroup }

// invalid is an ErrInvalid naming what is wrong.
func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
}

// checkIndex refuses an index (a model, a tenant and a block size) the
// service could not keep apart from others or would store wrapped.
func checkIndex(model, tenant string, blockSize int) error {
	switch {
	case model == "":
		return invalid("model_name: missing")
	case strings.ContainsFunc(model, unicode.IsControl) || !utf8.ValidString(model):
		return invalid("model_name: %q holds a control character or is not UTF-8", model)
	case strings.ContainsFunc(tenant, unicode.IsControl) || !utf8.ValidString(tenant) || strings.Contains(tenant, ":"):
		return invalid("tenant_id: %q holds a control character or ':' (\"model:tenant\" names an index), or is not UTF-8", tenant)
	case blockSize <= 0 || blockSize > MaxBlockSize:
		return invalid("block_size: %d, want 1 to %d", blockSize, MaxBlockSize)
	}
	return nil
}

// MaxBlockSize is the largest block size a model may be registered with:
// far above any engine's (vLLM's and SGLang's are 1 to a few hundred
// tokens), and small enough for every count the service keeps.
const MaxBlockSize = 1 << 16

// check refuses a registration the service could not keep apart from
// others or would store wrapped: each error names its field and wraps
// ErrInvalid.
func (r *Registration) check() error {
	if err := checkIndex(r.ModelName, r.TenantID, r.BlockSize); err != nil {
		return err
	}
	switch {
	case r.DPRank < 0 || r.DPRank > int(kvevent.MaxDPRank):
		return invalid("dp_rank: %d, want 0 to %d", r.DPRank, kvevent.MaxDPRank)
	case r.TotalKVBlocks < 0 || r.TotalKVBlocks > MaxKVBlocks:
		return invalid("total_kv_blocks: %d, want 1 to %d (or absent)", r.TotalKVBlocks, MaxKVBlocks)
	case r.Endpoint == "" && r.TotalKVBlocks == 0:
		return invalid("endpoint: missing (an engine without events needs total_kv_blocks)")
	case r.Endpoint == "" && r.ReplayEndpoint != "":
		return invalid("replay_endpoint: %q without an endpoint", r.ReplayEndpoint)
	case r.Type != "" && !slices.Contains(EngineTypes, r.Type):
		return invalid("type: %q, want one of %s (or absent)", r.Type, strings.Join(EngineTypes, ", "))
	}
	for _, ep := range [...]struct{ field, v string }{{"endpoint", r.Endpoint}, {"replay_endpoint", r.ReplayEndpoint}} {
		if ep.v == "" {
			continue
		}
		if err := checkEndpoint(ep.v); err != nil {
			return invalid("%s: %q: %v", ep.field, ep.v, err)
		}
	}
	return nil
}

// checkEndpoint accepts the ZeroMQ transports an engine publishes on, as a
// subscriber dials them: tcp://host:port, with a host other than the
// engine's bind-all "*" and a port from 1 to 65535, or ipc://path. An
// endpoint refused here could never be dialled: it would only fail its
// dials forever.
func checkEndpoint(ep string) error {
	if strings.ContainsFunc(ep, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return errors.New("holds a space or a control character")
	}
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		if path == "" {
			return errors.New("want ipc://path")
		}
		return nil
	}
	hostPort, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return errors.New("want tcp://host:port or ipc://path")
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return fmt.Errorf("want tcp://host:port: %v", err)
	}
	switch n, err := strconv.Atoi(port); {
	case host == "":
		return errors.New("want tcp://host:port: no host")
	case host == "*":
		return errors.New("host \"*\" is where the engine binds, on every interface: give the engine's host")
	case err != nil || !validPort(n):
		return fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return nil
}

func validPort(n int) bool { return n >= 1 && n <= 65535 }

// Check refuses, as Register would, a registration that is invalid (an
// ErrInvalid naming the field), before anything is registered.
func (r Registration) Check() error {
	if err := resolvePartition(&r); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return r.check()
}

// Register subscribes to an engine's KV events into its model's index.
// It does not wait for the engine: the registration is taken at once and
// the engine dialled in the background, and redialled with backoff (50 ms
// doubling to 5 s) for as long as it cannot be reached, until it is or
// the instance is unregistered. Workers says which (pending while the
// first dial is in progress, failed after, active once subscribed). Only
// a registration that can never be served is refused: invalid, a block
// size other than its model's, or the instance registered already.
func (s *Service) Register(r Registration) error { return s.subscribe(r, 0) }

// dial is a registered engine not yet subscribed to: its first dial in
// progress (err nil: pending), or failed and being retried (failed).
type dial struct {
	reg      Registration
	resumeAt uint64
	cancel   context.CancelFunc // ends the dialling (Unregister, Close)
	err      error              // the last dial's failure (mu)
}

// Dialling backoff: a failed engine is redialled after redialMin, then
// twice as long each time, up to redialMax.
const (
	redialMin = 50 * time.Millisecond
	redialMax = 5 * time.Second
)

// subscribe is Register, resuming the engine's stream at resumeAt (0:
// fresh). The instance is reserved under the registry lock and dialled in
// the background (dialUntilUp) with no lock held.
func (s *Service) subscribe(r Registration, resumeAt uint64) error {
	if err := resolvePartition(&r); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if r.TenantID == "" {
		r.TenantID = DefaultTenant
	}
	if err := r.check(); err != nil {
		return err
	}
	key := instanceKey{modelKey{r.ModelName, r.TenantID}, kvevent.WorkerID(r.InstanceID), r.DPRank}
	d := &dial{reg: r, resumeAt: resumeAt}
	ctx, idx, created, err := s.reserve(key, d)
	if err != nil {
		return err
	}
	if r.Endpoint == "" { // no events: nothing to dial
		s.complete(key, idx, created, d, nil)
		s.dialing.Done()
		return nil
	}
	go s.dialUntilUp(ctx, key, idx, created, d)
	return nil
}

// reserve admits the instance and marks it pending, creating its model's
// index if it is the first (created); the caller dials until ctx ends,
// then calls complete, then s.dialing.Done.
func (s *Service) reserve(key instanceKey, d *dial) (ctx context.Context, idx *index, created bool, err error) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if idx, err = s.admissible(key, d.reg.BlockSize); err != nil {
		return nil, nil, false, err
	}
	if created = idx == nil; created {
		if idx, err = s.createIndex(key.modelKey, d.reg.BlockSize); err != nil {
			return nil, nil, false, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if created {
			idx.close()
		}
		return nil, nil, false, ErrClosed
	}
	ctx, d.cancel = context.WithCancel(s.ctx)
	s.indexes[key.modelKey] = idx
	s.pending[key] = d
	s.dialing.Add(1)
	return ctx, idx, created, nil
}

// dialUntilUp dials the engine reserved as key until it is subscribed to
// or ctx ends (the instance unregistered, the service closed), recording
// each failure for Workers.
func (s *Service) dialUntilUp(ctx context.Context, key instanceKey, idx *index, created bool, d *dial) {
	defer s.dialing.Done()
	cfg := s.cfg.Subscriber
	cfg.BlockSize = d.reg.BlockSize
	ep := vllm.Endpoint{Worker: key.instance, Address: d.reg.Endpoint, Replay: d.reg.ReplayEndpoint, ResumeAt: d.resumeAt, DPRank: kvevent.DPRank(d.reg.DPRank),
		Model: d.reg.ModelName, Tenant: d.reg.TenantID}
	for wait := redialMin; ; wait = min(2*wait, redialMax) {
		sub, err := vllm.NewSubscriberContext(ctx, idx.sink, cfg, ep)
		if err == nil || ctx.Err() != nil {
			s.complete(key, idx, created, d, sub)
			return
		}
		s.mu.Lock()
		d.err = fmt.Errorf("%w: %v", ErrUnreachable, err)
		s.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			s.complete(key, idx, created, d, nil)
			return
		case <-t.C:
		}
	}
}

// complete registers the instance reserved as key with its subscriber,
// or, without one or with the reservation gone, closes the subscriber and
// drops the model's index if the reservation created it and nothing else
// uses it.
func (s *Service) complete(key instanceKey, idx *index, created bool, d *dial, sub *vllm.Subscriber) {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	s.mu.Lock()
	reserved := s.pending[key] == d && !s.closed
	if reserved {
		delete(s.pending, key)
	}
	d.cancel()
	if reserved && (sub != nil || d.reg.Endpoint == "") {
		if sub != nil && d.reg.TotalKVBlocks > 0 {
			// Active once its model's index is sized for it too; regMu
			// keeps registrations out meanwhile, mu only for the count.
			pools := s.poolsLocked(key.modelKey) + d.reg.TotalKVBlocks
			s.mu.Unlock()
			idx.reserve(pools)
			s.mu.Lock()
		}
		s.instances[key] = &instance{reg: d.reg, sub: sub, since: time.Now()}
		if n := d.reg.TotalKVBlocks; n > 0 {
			_ = idx.pred.model(key.worker(), n, sub == nil) // no error: n was checked
		}
		s.mu.Unlock()
		return
	}
	unused := created && s.indexes[key.modelKey] == idx && !s.usedLocked(key.modelKey)
	if unused {
		delete(s.indexes, key.modelKey)
	}
	s.mu.Unlock()
	if sub != nil {
		_ = sub.Close()
	}
	if unused {
		_ = idx.close()
	}
}

// poolsLocked sums the KV pools (total_kv_blocks) of model k's registered
// instances that publish events (mu held).
func (s *Service) poolsLocked(k modelKey) int {
	n := 0
	for ik, inst := range s.instances {
		if ik.modelKey == k && inst.sub != nil {
			n += inst.reg.TotalKVBlocks
		}
	}
	return n
}

// usedLocked reports whether an instance of model k is registered or
// pending (mu held).
func (s *Service) usedLocked(k modelKey) bool {
	for ik := range s.instances {
		if ik.modelKey == k {
			return true
		}
	}
	for ik := range s.pending {
		if ik.modelKey == k {
			return true
		}
	}
	return false
}

// admissible says whether an instance may be registered with the block
// size, and returns its model's index if there is one yet.
func (s *Service) admissible(key instanceKey, blockSize int) (*index, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if _, ok := s.instances[key]; ok || s.pending[key] != nil {
		return nil, fmt.Errorf("%w: instance %d rank %d of %s:%s is registered already", ErrConflict, key.instance, key.rank, key.model, key.tenant)
	}
	if n := len(s.instances) + len(s.pending); n >= s.cfg.MaxInstances {
		return nil, fmt.Errorf("%w: %d engines (instance ranks) registered, at most %d", ErrFull, n, s.cfg.MaxInstances)
	}
	idx := s.indexes[key.modelKey]
	if idx == nil && len(s.indexes) >= s.cfg.MaxIndexes {
		return nil, fmt.Errorf("%w: %d indexes (models and routing groups), at most %d; %s:%s would be another", ErrFull, len(s.indexes), s.cfg.MaxIndexes, key.model, key.tenant)
	}
	if idx != nil && idx.blockSize != blockSize {
		return nil, fmt.Errorf("%w: block_size %d, model %s:%s has %d", ErrConflict, blockSize, key.model, key.tenant, idx.blockSize)
	}
	return idx, nil
}

// Unregistration is a POST /unregister body: no tenant means every
// tenant of the model, no rank every rank.
type Unregistration struct {
	InstanceID   uint64 `json:"instance_id"`
	ModelName    string `json:"model_name"`
	TenantID     string `json:"tenant_id,omitempty"`
	RoutingGroup string `json:"routing_group,omitempty"` // Dynamo's name of the partition; tenant_id is its synonym
	DPRank       *int   `json:"dp_rank,omitempty"`
}

func (x *Unregistration) partition() (*string, string) { return &x.TenantID, x.RoutingGroup }

// names reports whether u speaks of the engine registered as key: its
// model and instance, in its tenant and rank if u gives them.
func (u *Unregistration) names(key instanceKey) bool {
	return key.model == u.ModelName && key.instance == kvevent.WorkerID(u.InstanceID) &&
		(u.TenantID == "" || key.tenant == u.TenantID) && (u.DPRank == nil || key.rank == *u.DPRank)
}

// leaving is an instance being unregistered.
type leaving struct {
	key  instanceKey
	inst *instance
	idx  *index
}

// Unregister stops following the instance and drops its blocks, and its
// model's index if no instance is left.
func (s *Service) Unregister(u Unregistration) error {
	if err := resolvePartition(&u); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	s.regMu.Lock()
	defer s.regMu.Unlock()
	var gone []leaving
	s.mu.Lock()
	var dials []leaving // registered, never subscribed to
	for key, d := range s.pending {
		if u.names(key) {
			delete(s.pending, key) // its dial, ended, finds it gone
			d.cancel()
			dials = append(dials, leaving{key, nil, s.indexes[key.modelKey]})
		}
	}
	for key, inst := range s.instances {
		if u.names(key) {
			delete(s.instances, key)
			gone = append(gone, leaving{key, inst, s.indexes[key.modelKey]})
			s.indexes[key.modelKey].pred.forget(key.worker())
		}
	}
	// The requests in flight there are freed with them: their ids may be
	// used again at once.
	for _, g := range gone {
		_ = s.syncRouter(g.key.modelKey, g.idx) // no error: the workers come from a map's keys, none twice
	}
	s.mu.Unlock()
	if len(gone) == 0 && len(dials) == 0 {
		return fmt.Errorf("%w: no instance %d of model %q", ErrUnknownModel, u.InstanceID, u.ModelName)
	}
	var err error
	// An engine never reached may still hold blocks in the index: those a
	// saved state restored. Its registered rank's leave.
	for _, g := range dials {
		if !s.registered(g.key) {
			err = errors.Join(err, g.idx.sink.ApplyEvent(kvevent.RouterEvent{WorkerID: g.key.instance,
				Event: kvevent.Event{DPRank: kvevent.DPRank(g.key.rank), Data: kvevent.Cleared{}}}))
		}
	}
	gone = append(gone, dials...)
	for _, g := range gone {
		if g.inst == nil || g.inst.sub == nil {
			continue // dialled, never subscribed to: done above; or without events
		}
		_ = g.inst.sub.Close()
		// The blocks of every rank the engine wrote leave (its batches may
		// name ranks other than the one registered): a Cleared event of
		// each, after whatever its subscriber queued.
		for _, rank := range g.inst.sub.Ranks() {
			if s.registered(instanceKey{g.key.modelKey, g.key.instance, int(rank)}) {
				continue // another engine's, still registered
			}
			err = errors.Join(err, g.idx.sink.ApplyEvent(kvevent.RouterEvent{WorkerID: g.key.instance,
				Event: kvevent.Event{DPRank: rank, Data: kvevent.Cleared{}}}))
		}
	}
	return errors.Join(err, s.dropUnused(gone))
}

// dropUnused drops the indexes of the instances gone that no instance
// uses any more (regMu held): a model whose last engine left costs
// nothing (its lanes, goroutines and memory go, and the next save leaves
// it out). An index on a bus stays: it follows the engines registered
// with every replica, not only this one's.
func (s *Service) dropUnused(gone []leaving) error {
	var err error
	for _, g := range gone {
		s.mu.Lock()
		idx := s.indexes[g.key.modelKey]
		drop := idx == g.idx && idx.bus == nil && !s.usedLocked(g.key.modelKey)
		if drop {
			delete(s.indexes, g.key.modelKey)
		}
		s.mu.Unlock()
		if drop {
			err = errors.Join(err, idx.close())
		}
	}
	return err
}

// registered reports whether an engine is registered as key.
func (s *Service) registered(key instanceKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.instances[key]
	return ok
}

// Ready reports whether the service serves all it is going to: its saved
// state recovered (with Config.StateDir) or its peer's dump applied, every
// registered engine either caught up (subscribed to, and what it published
// before the subscription, or since the saved state, replayed) or failed
// (its dials are retried; it does not hold readiness back), and not
// closed; if not, why.
func (s *Service) Ready() (bool, string) {
	if s.recovering.Load() {
		return false, "recovering the saved state"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return false, "closed"
	}
	if n := s.firstDialsLocked(); n > 0 {
		return false, fmt.Sprintf("%d engines being dialled for the first time", n)
	}
	catching := 0
	for _, inst := range s.instances {
		if inst.sub != nil && !inst.sub.CaughtUp() {
			catching++
		}
	}
	if catching > 0 {
		return false, fmt.Sprintf("%d engines replaying what they published before the subscription (or since the saved state)", catching)
	}
	return true, ""
}

// firstDialsLocked counts the engines whose first dial is in progress (mu
// held).
func (s *Service) firstDialsLocked() int {
	n := 0
	for _, d := range s.pending {
		if d.err == nil {
			n++
		}
	}
	return n
}

// Worker is one registered instance of a model and routing group, as
// GET /workers lists it (Dynamo's WorkerInfo): its endpoints and
// listeners by data-parallel rank, and its status, its listeners' taken
// together as Dynamo takes them: "failed" if one is (its dials failed;
// they are retried), else "pending" if one's first dial is in progress,
// else "active".
type Worker struct {
	InstanceID uint64 `json:"instance_id"`
	Source     string `json:"source"` // "zmq", or "none" for an engine without events
	Status     string `json:"status"`
	// TotalKVBlocks is the registration's (its ranks' greatest), when
	// given: the service models the engine's cache (see approx.go).
	TotalKVBlocks int `json:"total_kv_blocks,omitempty"`
	// Predicted is why the engine is routed on that model, if it is:
	// "event_free" or "stale" (its ranks' first reason).
	Predicted string `json:"predicted,omitempty"`
	// Type is the registration's type, if it gave one.
	Type         string              `json:"type,omitempty"`
	ModelName    string              `json:"model_name"`
	RoutingGroup string              `json:"routing_group"`
	BlockSize    int                 `json:"block_size"`
	Endpoints    map[string]string   `json:"endpoints"` // by data-parallel rank
	Listeners    map[string]Listener `json:"listeners"` // by data-parallel rank
}

// Listener is one rank's subscription: its endpoint, status (active,
// pending or failed) and, failed, the last dial's error.
type Listener struct {
	Endpoint  string `json:"endpoint"`
	Status    string `json:"status"`
	LastError string `json:"last_error,omitempty"`
}

// statusRank orders statuses: an instance shows its worst rank's, as
// Dynamo aggregates them.
var statusRank = map[string]int{"active": 0, "pending": 1, "failed": 2}

// Workers lists the instances registered, by model, routing group and id;
// a non-empty model or group keeps only theirs.
func (s *Service) Workers(model, group string) []Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	type key struct {
		modelKey
		instance kvevent.WorkerID
	}
	byKey := map[key]*Worker{}
	add := func(ik instanceKey, reg Registration, l Listener) {
		endpoint := reg.Endpoint
		if model != "" && ik.model != model || group != "" && ik.tenant != group {
			return
		}
		k := key{ik.modelKey, ik.instance}
		w := byKey[k]
		if w == nil {
			w = &Worker{InstanceID: uint64(ik.instance), Source: "zmq", Status: l.Status, ModelName: ik.model, RoutingGroup: ik.tenant,
				Endpoints: map[string]string{}, Listeners: map[string]Listener{}}
			if endpoint == "" {
				w.Source = "none"
			}
			if idx := s.indexes[ik.modelKey]; idx != nil {
				w.BlockSize = idx.blockSize
			}
			byKey[k] = w
		}
		w.TotalKVBlocks = max(w.TotalKVBlocks, reg.TotalKVBlocks)
		if w.Type == "" {
			w.Type = reg.Type
		}
		if idx := s.indexes[ik.modelKey]; idx != nil && w.Predicted == "" {
			w.Predicted = idx.pred.state.Load().routed[ik.worker()]
		}
		if statusRank[l.Status] > statusRank[w.Status] {
			w.Status = l.Status
		}
		rank := fmt.Sprint(ik.rank)
		w.Endpoints[rank], w.Listeners[rank] = endpoint, l
	}
	for ik, d := range s.pending {
		l := Listener{Endpoint: d.reg.Endpoint, Status: "pending"}
		if d.err != nil {
			l.Status, l.LastError = "failed", d.err.Error()
		}
		add(ik, d.reg, l)
	}
	for ik, inst := range s.instances {
		add(ik, inst.reg, Listener{Endpoint: inst.reg.Endpoint, Status: "active"})
	}
	out := make([]Worker, 0, len(byKey))
	for _, w := range byKey {
		out = append(out, *w)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.ModelName < b.ModelName || a.ModelName == b.ModelName &&
			(a.RoutingGroup < b.RoutingGroup || a.RoutingGroup == b.RoutingGroup && a.InstanceID < b.InstanceID)
	})
	return out
}

// lookup returns the index of a model and tenant.
func (s *Service) lookup(model, tenant string) (*index, error) {
	if tenant == "" {
		tenant = DefaultTenant
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := s.indexes[modelKey{model, tenant}]
	if idx == nil {
		return nil, noIndexer{model, tenant}
	}
	return idx, nil
}

// noIndexer is lookup's error for a (model, routing group) with no index,
// in Dynamo's words.
type noIndexer struct{ model, group string }

func (e noIndexer) Error() string {
	return fmt.Sprintf("no indexer for model=%s routing_group=%s", e.model, e.group)
}

func (e noIndexer) Is(target error) bool { return target == ErrUnknownModel }

// createIndex returns a new index of model k (regMu held): an empty one,
// or on a bus one following the model's stream.
func (s *Service) createIndex(k modelKey, blockSize int) (*index, error) {
	if s.bus != nil {
		ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
		defer cancel()
		return s.bus.join(ctx, k, blockSize)
	}
	return indexOver(s.cfg.pools().newPool(blockSize), blockSize, s.cfg.PredictTTL), nil
}

// poolConfig is what a model's pool is made of (Config's Lanes, Tiers and
// IndexBlocks).
type poolConfig struct {
	lanes, blocks int
	tiers         bool
}

func (c *Config) pools() poolConfig {
	return poolConfig{lanes: c.Lanes, blocks: c.IndexBlocks, tiers: c.Tiers}
}

// sizedFor returns c sizing its pools' trees for blocks blocks too, if
// more than c's own (at most MaxIndexBlocks).
func (c poolConfig) sizedFor(blocks int) poolConfig {
	c.blocks = max(c.blocks, min(blocks, MaxIndexBlocks))
	return c
}

// newPool returns an empty pool, keeping every tier or the device's, its
// tree sized for c.blocks blocks if set (radix.NewCompressedTreeSized).
func (c poolConfig) newPool(blockSize int) *shardpool.Pool {
	tree := radix.NewCompressedTreeSized(c.blocks)
	if c.tiers {
		return shardpool.NewPoolTiersOver(c.lanes, blockSize, tree)
	}
	return shardpool.NewPoolOver(c.lanes, blockSize, tree)
}

// reserve sizes the index's table of engine hashes for blocks blocks
// (radix.CompressedTree.Reserve), at most MaxIndexBlocks: as engines that
// publish events register with their pools (total_kv_blocks), the
// model's index is sized for them all, so that their stores fill a table
// that need not grow. It resizes only where the sum asks for a larger
// table than the index has (Config.IndexBlocks's, or the engines' that
// registered before): about each time the sum doubles, a few times as a
// fleet registers, each time moving the entries held so far while the
// model's stores wait. On a bus, a replica sizes its own index, from the
// registrations it takes.
func (idx *index) reserve(blocks int) {
	if t, ok := idx.pool.Index().(interface{ Reserve(int) bool }); ok {
		t.Reserve(min(blocks, MaxIndexBlocks))
	}
}

// indexOver returns the index of pool, with its router and predictions
// (decisions counted for predictTTL, if not 0).
func indexOver(pool *shardpool.Pool, blockSize int, predictTTL time.Duration) *index {
	return &index{pool: pool, sink: pool, blockSize: blockSize, tiers: pool.KeepsTiers(), router: &modelRouter{}, pred: newPredictions(blockSize, predictTTL)}
}

// Close stops every subscriber and, with Config.StateDir, saves the state
// (the subscribers first, so that each index and each engine's position
// agree), then closes the indexes.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel() // abandons the dials of pending instances
	s.bg.Wait()
	s.dialing.Wait()
	s.regMu.Lock() // no registration comes after: closed
	defer s.regMu.Unlock()
	var err error
	resumeAt := map[instanceKey]uint64{}
	for k, inst := range s.instances {
		if inst.sub != nil {
			err = errors.Join(err, inst.sub.Close())
		}
		resumeAt[k] = resumePoint(inst)
	}
	if s.cfg.StateDir != "" {
		err = errors.Join(err, s.saveClosed(resumeAt))
	}
	for _, idx := range s.indexes {
		err = errors.Join(err, idx.close())
	}
	if s.bus != nil {
		s.bus.dir.Close()
	}
	return err
}

// saveClosed saves the state once the subscribers are closed (regMu
// held).
func (s *Service) saveClosed(resumeAt map[instanceKey]uint64) (err error) {
	defer s.metrics.observeSave(time.Now(), &err)
	snaps := map[modelKey][]byte{}
	for k, idx := range s.indexes {
		snap, err := encodeIndex(idx)
		if err != nil {
			return err
		}
		snaps[k] = snap
	}
	return s.write(snaps, resumeAt)
}
