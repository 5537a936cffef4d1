package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/router"
)

// The router core over HTTP: POST /route picks an instance (and rank) for
// a prompt by overlap and load, with kvradix's scheduler, and admits the
// request into that instance's load; POST /requests/{id}/first_token and
// /complete release its prefill and then all of it. A request neither
// completed nor reported within Config.RequestTTL expires, so a client
// that crashed cannot pin load for good.

// RouteRequest is a POST /route body: token_ids, or block_hashes (local
// hashes at the model's block size).
type RouteRequest struct {
	TokenIDs     []uint32 `json:"token_ids,omitempty"`
	BlockHashes  Hashes   `json:"block_hashes,omitempty"` // unsigned or signed (see Hashes)
	ModelName    string   `json:"model_name"`
	TenantID     string   `json:"tenant_id,omitempty"`
	RoutingGroup string   `json:"routing_group,omitempty"` // Dynamo's name of the partition; tenant_id is its synonym
	RequestID    string   `json:"request_id,omitempty"`    // the caller's; a new UUID if empty
}

func (x *RouteRequest) partition() (*string, string) { return &x.TenantID, x.RoutingGroup }

// RouteAnswer is POST /route's answer: the chosen instance and rank, its
// cost terms, and every candidate's, so a caller can see why.
type RouteAnswer struct {
	Candidate           // the chosen instance and rank, and its terms
	RequestID    string `json:"request_id"`
	PromptBlocks int    `json:"prompt_blocks"`
	// OverlapWeight is the scheduler's weight of prefill in the cost.
	OverlapWeight float64     `json:"overlap_weight"`
	Candidates    []Candidate `json:"candidates"` // by instance and rank
}

// Candidate is one (instance, rank)'s terms in a routing decision, as the
// scheduler weighed them before admitting the request:
//
//	cost = overlap_weight · prefill_tokens / block_size + decode_blocks
//
// prefill_tokens being the instance's active prefill plus the request's
// uncached tokens there, decode_blocks its active blocks plus the
// request's new ones (router.Scheduler). The lowest cost wins, ties broken
// at random.
type Candidate struct {
	InstanceID     uint64  `json:"instance_id"`
	DPRank         int     `json:"dp_rank"`
	OverlapBlocks  uint32  `json:"overlap_blocks"`
	PrefillTokens  int     `json:"prefill_tokens"`
	DecodeBlocks   int     `json:"decode_blocks"`
	ActiveRequests int     `json:"active_requests"`
	Cost           float64 `json:"cost"`
	// Predicted marks an instance routed on the model of its cache (no
	// events, or stale ones), or whose overlap_blocks came from the
	// decisions of the last -predict-ttl: more than its events say.
	Predicted bool `json:"predicted,omitempty"`
}

// modelRouter is one model's scheduler, over its registered instances
// (Service.syncRouter keeps them in step, s.mu held).
type modelRouter struct {
	mu      sync.Mutex
	sched   *router.Scheduler
	workers []kvevent.Worker
}

// route is a request in flight, in Service.routes. The scheduler keeps its
// blocks and load; the service, which model's it is and when it expires.
type route struct {
	m      *modelRouter
	pred   *predictions // its model's: its lease there ends with it
	name   string       // its request_id, when not a canonical UUID (see routeKey)
	at     int64        // its deadline, Unix ns; 0 while being admitted
	blocks int          // what it counts against Config.MaxRoutedBlocks
}

// addRoute keeps a request in flight (s.mu held), or refuses it if the
// requests in flight would hold more than Config.MaxRoutedBlocks.
func (s *Service) addRoute(key uuid.UUID, rt *route) error {
	if s.routed+rt.blocks > s.cfg.MaxRoutedBlocks {
		return fmt.Errorf("%w: requests in flight hold %d blocks (their prompts' and %d each), at most %d: complete some, or wait for their TTL", ErrFull, s.routed, RouteOverheadBlocks, s.cfg.MaxRoutedBlocks)
	}
	s.routes[key] = rt
	s.routed += rt.blocks
	return nil
}

// dropRoute forgets a request in flight (s.mu held).
func (s *Service) dropRoute(key uuid.UUID) {
	if rt := s.routes[key]; rt != nil {
		s.routed -= rt.blocks
		delete(s.routes, key)
	}
}

// end frees the request in the scheduler and its lease in the model of its
// instance's cache (rt.m.mu held).
func (rt *route) end(key uuid.UUID) {
	_ = rt.m.sched.Free(key) // unknown to it: admitted on an instance as it left
	_, _ = rt.pred.approx.Release(key)
}

// routeKey is the key request id is kept under, in the service and in the
// scheduler: a canonical UUID (as uuid.NewString writes it) is its own
// key, with no name kept; any other id, the SHA-1 name UUID of it, with
// the id as its name, so that two ids never share a route.
func routeKey(id string) (uuid.UUID, string) {
	if len(id) == 36 {
		if u, err := uuid.Parse(id); err == nil && u.String() == id {
			return u, ""
		}
	}
	return uuid.NewSHA1(routeSpace, []byte(id)), id
}

// routeSpace is the namespace of request ids' name UUIDs.
var routeSpace = uuid.MustParse("6b767261-6469-7852-a075-746573000000")

// workersOf lists the registered (instance, rank) pairs of a model (s.mu
// held).
func (s *Service) workersOf(k modelKey) []kvevent.Worker {
	var ws []kvevent.Worker
	for key := range s.instances {
		if key.modelKey == k {
			ws = append(ws, key.worker())
		}
	}
	sort.Slice(ws, func(i, j int) bool {
		return ws[i].ID < ws[j].ID || ws[i].ID == ws[j].ID && ws[i].DPRank < ws[j].DPRank
	})
	return ws
}

// syncRouter brings the model's scheduler to its registered instances
// (s.mu held): the requests in flight on instances gone are freed, and
// their ids may be used again at once.
func (s *Service) syncRouter(k modelKey, idx *index) error {
	ws, m := s.workersOf(k), idx.router
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sched != nil && slices.Equal(ws, m.workers) {
		return nil
	}
	if m.sched == nil {
		if len(ws) == 0 {
			return nil
		}
		sched, err := router.NewScheduler(router.SchedulerConfig{BlockSize: idx.blockSize, OverlapWeight: routeWeight,
			MaxBatchedTokens: 8192, TrackPrefillTokens: true}, ws)
		if err != nil {
			return err
		}
		m.sched, m.workers = sched, ws
		return nil
	}
	dropped, err := m.sched.SetWorkers(nil, ws)
	if err != nil {
		return err
	}
	for _, key := range dropped {
		s.dropRoute(key)
	}
	m.workers = ws
	return nil
}

// admit schedules a request as key; it returns the chosen worker and every
// candidate's terms (m.mu holds the scheduler still between weighing them
// and deciding).
func (m *modelRouter) admit(key uuid.UUID, blockSize, isl int, seq []uint64, overlaps map[kvevent.Worker]uint32, tiers map[kvevent.Worker][kvevent.NumTiers]uint32) (kvevent.Worker, []Candidate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	req := router.SchedRequest{ID: key, ISL: isl, Blocks: seq, Overlaps: overlaps, TierOverlaps: tiers}
	loads := m.sched.PotentialLoads(req)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wk, err := m.sched.Schedule(ctx, req)
	if err != nil {
		return kvevent.Worker{}, nil, err
	}
	cands := make([]Candidate, len(loads))
	for i, l := range loads {
		cands[i] = Candidate{InstanceID: uint64(l.Worker.ID), DPRank: int(l.Worker.DPRank), OverlapBlocks: overlaps[l.Worker],
			PrefillTokens: l.PrefillTokens, DecodeBlocks: l.DecodeBlocks, ActiveRequests: l.ActiveRequests,
			Cost: routeWeight*float64(l.PrefillTokens)/float64(blockSize) + float64(l.DecodeBlocks)}
	}
	return wk, cands, nil
}

// MaxRequestID bounds a route's request_id (a UUID is 36 bytes): the id
// is kept for as long as the request is in flight.
const MaxRequestID = 256

// routeWeight is the routes' overlap weight (router.DefaultOverlapWeight).
const routeWeight = router.DefaultOverlapWeight

func (s *Service) route(w http.ResponseWriter, r *http.Request) {
	var q RouteRequest
	if !s.decode(w, r, &q) {
		return
	}
	switch {
	case (len(q.TokenIDs) == 0) == (len(q.BlockHashes) == 0):
		fail(w, http.StatusBadRequest, errors.New("token_ids, block_hashes: give exactly one"))
		return
	case len(q.TokenIDs) > s.cfg.MaxTokens || len(q.BlockHashes) > s.cfg.MaxTokens:
		fail(w, http.StatusBadRequest, fmt.Errorf("token_ids or block_hashes: at most %d", s.cfg.MaxTokens))
		return
	case len(q.RequestID) > MaxRequestID:
		fail(w, http.StatusBadRequest, fmt.Errorf("request_id: %d bytes, at most %d", len(q.RequestID), MaxRequestID))
		return
	}
	k := modelKey{q.ModelName, tenantOr(q.TenantID)}
	idx, err := s.lookup(k.model, k.tenant)
	if err != nil {
		fail(w, status(err), err)
		return
	}
	start := time.Now()
	local, isl := q.BlockHashes, len(q.BlockHashes)*idx.blockSize
	if q.TokenIDs != nil {
		local, isl = hashing.LocalHashes(nil, q.TokenIDs, idx.blockSize, hashing.Options{}), len(q.TokenIDs)
	}
	scores, predicted, events, pst, err := idx.match(local, true)
	var tiers radix.TierScores
	if err == nil && idx.tiers {
		tiers, err = idx.pool.FindTierMatches(local)
	}
	if err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	if q.RequestID == "" {
		q.RequestID = uuid.NewString()
	}

	// The id is reserved first, and given back if the request is not
	// admitted; the scheduler is brought to the instances registered.
	key, name := routeKey(q.RequestID)
	s.mu.Lock()
	if s.routes[key] != nil {
		s.mu.Unlock()
		fail(w, http.StatusConflict, fmt.Errorf("request_id: %q is in flight", q.RequestID))
		return
	}
	if err := s.syncRouter(k, idx); err != nil || idx.router.sched == nil {
		s.mu.Unlock()
		fail(w, http.StatusServiceUnavailable, fmt.Errorf("model %s:%s has no instance registered", k.model, k.tenant))
		return
	}
	rt := &route{m: idx.router, pred: idx.pred, name: name, blocks: len(local) + RouteOverheadBlocks}
	if err := s.addRoute(key, rt); err != nil {
		s.mu.Unlock()
		fail(w, status(err), err)
		return
	}
	s.mu.Unlock()
	seq := hashing.SequenceHashes(nil, local)
	wk, cands, err := rt.m.admit(key, idx.blockSize, isl, seq, scores.Scores, tiers.Scores)
	if err == nil {
		if err = s.predict(k, idx, pst, key, wk, local, seq, isl, predicted[wk], events[wk]); err != nil {
			rt.m.mu.Lock()
			rt.end(key)
			rt.m.mu.Unlock()
		}
	}
	s.mu.Lock()
	switch {
	case s.routes[key] != rt: // its instance left meanwhile: freed
		if err == nil {
			idx.pred.abandon(key, wk)
		}
	case err != nil:
		s.dropRoute(key)
	default:
		rt.at = time.Now().Add(s.cfg.RequestTTL).UnixNano()
		s.expectExpiry(expiry{rt.at, key})
	}
	s.mu.Unlock()
	if err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	a := RouteAnswer{RequestID: q.RequestID, PromptBlocks: len(local), OverlapWeight: routeWeight, Candidates: cands}
	for i, c := range cands {
		w := kvevent.Worker{ID: kvevent.WorkerID(c.InstanceID), DPRank: kvevent.DPRank(c.DPRank)}
		cands[i].Predicted = pst.routed[w] != "" || c.OverlapBlocks > events[w]
		if w == wk {
			a.Candidate = cands[i]
		}
	}
	s.metrics.observeRoute(k.model, k.tenant, start, a.InstanceID)
	reply(w, http.StatusOK, a)
}

// release handles /requests/{id}/first_token and /complete.
func (s *Service) release(complete bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		key, name := routeKey(id)
		s.mu.Lock()
		rt := s.routes[key]
		if rt == nil || rt.name != name || rt.at == 0 {
			s.mu.Unlock()
			fail(w, http.StatusNotFound, fmt.Errorf("request %q: not in flight (unknown, completed, expired, or being routed)", id))
			return
		}
		if complete {
			s.dropRoute(key)
		}
		// m.mu is taken before s.mu is let go: a later route of the same
		// id is admitted after this release.
		rt.m.mu.Lock()
		s.mu.Unlock()
		defer rt.m.mu.Unlock()
		if complete {
			rt.end(key)
		} else { // unknown to the scheduler: admitted on an instance as it left
			_ = rt.m.sched.MarkPrefillCompleted(key)
		}
		reply(w, http.StatusOK, map[string]string{"request_id": id})
	}
}

// expiry is when a routed request's TTL ends. The service keeps them in
// the order they were admitted, which (one TTL for all) is the order of
// their deadlines: expire looks only at the front.
type expiry struct {
	at  int64 // Unix ns
	key uuid.UUID
}

// expectExpiry queues a request's deadline (s.mu held), compacting the
// queue when mostly requests already completed wait in it.
func (s *Service) expectExpiry(e expiry) {
	s.expiries = append(s.expiries, e)
	if live := len(s.routes); len(s.expiries) > 2*live+1024 {
		kept := s.expiries[:0]
		for _, e := range s.expiries {
			if rt := s.routes[e.key]; rt != nil && rt.at == e.at {
				kept = append(kept, e)
			}
		}
		clear(s.expiries[len(kept):])
		s.expiries = kept
	}
}

// expire frees the requests past their TTL, every second, until Close:
// the front of the queue, so a tick costs what expires, not what is in
// flight.
func (s *Service) expire() {
	t := time.NewTicker(min(time.Second, s.cfg.RequestTTL/2))
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case now := <-t.C:
			s.expireBy(now.UnixNano())
			s.mu.Lock()
			s.checkStale(now)
			s.mu.Unlock()
		}
	}
}

// expireBy frees the requests whose deadline is before now.
func (s *Service) expireBy(now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for ; n < len(s.expiries) && now > s.expiries[n].at; n++ {
		e := s.expiries[n]
		// Another route of the key (completed and routed again) has a
		// deadline of its own; one being admitted, none yet.
		if rt := s.routes[e.key]; rt != nil && rt.at != 0 && now > rt.at {
			s.dropRoute(e.key)
			rt.m.mu.Lock()
			rt.end(e.key)
			rt.m.mu.Unlock()
		}
	}
	clear(s.expiries[:n])
	s.expiries = s.expiries[n:]
}
