package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
}

// modelRouter is one model's scheduler over its registered instances,
// rebuilt when they change, with the requests in flight carried over.
type modelRouter struct {
	mu      sync.Mutex
	sched   *router.Scheduler
	workers []kvevent.Worker
	reqs    map[string]*routed
}

// routed is a request in flight: what re-admitting it into a rebuilt
// scheduler takes (its blocks, and its overlap on its own worker), and no
// more (not the prompt, nor every worker's overlap).
type routed struct {
	id       uuid.UUID
	isl      int
	worker   kvevent.Worker
	overlap  uint32
	tiers    *[kvevent.NumTiers]uint32 // its overlap per tier, with Config.Tiers
	prefill  bool                      // first token reported
	orphan   bool                      // its instance left: not in the scheduler
	deadline int64                     // Unix ns
}

// request returns what the scheduler admits r as, with its blocks (the
// scheduler's copy: the request keeps none of its own).
func (r *routed) request(blocks []uint64) router.SchedRequest {
	req := router.SchedRequest{ID: r.id, ISL: r.isl, Blocks: blocks, Overlaps: map[kvevent.Worker]uint32{r.worker: r.overlap}}
	if r.tiers != nil {
		req.TierOverlaps = map[kvevent.Worker][kvevent.NumTiers]uint32{r.worker: *r.tiers}
	}
	return req
}

// workersOf lists the registered (instance, rank) pairs of a model (s.mu
// held).
func (s *Service) workersOf(k modelKey) []kvevent.Worker {
	var ws []kvevent.Worker
	for key := range s.instances {
		if key.modelKey == k {
			ws = append(ws, kvevent.Worker{ID: key.instance, DPRank: kvevent.DPRank(key.rank)})
		}
	}
	sort.Slice(ws, func(i, j int) bool {
		return ws[i].ID < ws[j].ID || ws[i].ID == ws[j].ID && ws[i].DPRank < ws[j].DPRank
	})
	return ws
}

// scheduler returns the model's router over ws, rebuilding its scheduler
// (and re-admitting the requests in flight on instances still there) if
// the instances changed.
func (m *modelRouter) scheduler(ws []kvevent.Worker, blockSize int) (*router.Scheduler, error) {
	if m.sched != nil && slicesEqual(ws, m.workers) {
		return m.sched, nil
	}
	sched, err := router.NewScheduler(router.SchedulerConfig{BlockSize: blockSize, OverlapWeight: routeWeight,
		MaxBatchedTokens: 8192, TrackPrefillTokens: true}, ws)
	if err != nil {
		return nil, err
	}
	for _, r := range m.reqs {
		if r.orphan || sched.Admit(r.request(m.sched.Blocks(r.id)), r.worker) != nil {
			// Its instance left (Unregister frees such requests; this one
			// was admitted as it left): it counts nowhere, and its id
			// stays the caller's to complete until its TTL.
			r.orphan = true
			continue
		}
		if r.prefill {
			_ = sched.MarkPrefillCompleted(r.id)
		}
	}
	m.sched, m.workers = sched, ws
	return sched, nil
}

// admit schedules a request and records it in flight; it returns the
// chosen worker and every candidate's terms (m.mu holds the scheduler
// still between weighing them and deciding).
func (m *modelRouter) admit(ws []kvevent.Worker, blockSize int, id string, isl int, local []uint64, overlaps map[kvevent.Worker]uint32, tiers map[kvevent.Worker][kvevent.NumTiers]uint32, deadline time.Time) (kvevent.Worker, []Candidate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sched, err := m.scheduler(ws, blockSize)
	if err != nil {
		return kvevent.Worker{}, nil, err
	}
	req := router.SchedRequest{ID: uuid.New(), ISL: isl, Blocks: hashing.SequenceHashes(nil, local), Overlaps: overlaps, TierOverlaps: tiers}
	loads := sched.PotentialLoads(req)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wk, err := sched.Schedule(ctx, req)
	if err != nil {
		return kvevent.Worker{}, nil, err
	}
	rq := &routed{id: req.ID, isl: isl, worker: wk, overlap: overlaps[wk], deadline: deadline.UnixNano()}
	if t, ok := tiers[wk]; ok {
		rq.tiers = &t
	}
	m.reqs[id] = rq
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

func slicesEqual(a, b []kvevent.Worker) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

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
	scores, err := idx.pool.FindMatches(local)
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

	// The id is reserved first (s.mu, then m.mu: the order expire takes
	// them in), and given back if the request is not admitted.
	s.mu.Lock()
	ws := s.workersOf(k)
	m := idx.router
	if s.routes[q.RequestID] != nil {
		s.mu.Unlock()
		fail(w, http.StatusConflict, fmt.Errorf("request_id: %q is in flight", q.RequestID))
		return
	}
	if len(ws) == 0 {
		s.mu.Unlock()
		fail(w, http.StatusServiceUnavailable, fmt.Errorf("model %s:%s has no instance registered", k.model, k.tenant))
		return
	}
	s.routes[q.RequestID] = m
	s.mu.Unlock()
	deadline := time.Now().Add(s.cfg.RequestTTL)
	wk, cands, err := m.admit(ws, idx.blockSize, q.RequestID, isl, local, scores.Scores, tiers.Scores, deadline)
	s.mu.Lock()
	if err != nil {
		delete(s.routes, q.RequestID)
	} else {
		s.expectExpiry(expiry{deadline.UnixNano(), q.RequestID, m})
	}
	s.mu.Unlock()
	if err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	a := RouteAnswer{RequestID: q.RequestID, PromptBlocks: len(local), OverlapWeight: routeWeight, Candidates: cands}
	for _, c := range cands {
		if c.InstanceID == uint64(wk.ID) && c.DPRank == int(wk.DPRank) {
			a.Candidate = c
		}
	}
	s.metrics.observeRoute(k.model, k.tenant, start, a.InstanceID)
	reply(w, http.StatusOK, a)
}

// release handles /requests/{id}/first_token and /complete.
func (s *Service) release(complete bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		s.mu.Lock()
		m := s.routes[id]
		if complete {
			delete(s.routes, id)
		}
		s.mu.Unlock()
		if m == nil {
			fail(w, http.StatusNotFound, fmt.Errorf("request %q: not in flight (unknown, completed or expired)", id))
			return
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		rq := m.reqs[id]
		if rq == nil {
			fail(w, http.StatusNotFound, fmt.Errorf("request %q: not in flight", id))
			return
		}
		switch {
		case rq.orphan:
			if complete {
				delete(m.reqs, id)
			}
		case complete:
			delete(m.reqs, id)
			_ = m.sched.Free(rq.id)
		case !rq.prefill:
			rq.prefill = true
			_ = m.sched.MarkPrefillCompleted(rq.id)
		}
		reply(w, http.StatusOK, map[string]string{"request_id": id})
	}
}

// freeRoutesOf frees the requests in flight on the instances gone (s.mu
// held): their ids are free again, at once.
func (s *Service) freeRoutesOf(gone map[*modelRouter]map[kvevent.Worker]bool) {
	for id, m := range s.routes {
		ws := gone[m]
		if ws == nil {
			continue
		}
		m.mu.Lock()
		if rq := m.reqs[id]; rq != nil && ws[rq.worker] {
			s.forgetRoute(m, id, rq)
		}
		m.mu.Unlock()
	}
}

// forgetRoute frees request id, rq in m, from the scheduler and the
// service (s.mu and m.mu held).
func (s *Service) forgetRoute(m *modelRouter, id string, rq *routed) {
	if !rq.orphan {
		_ = m.sched.Free(rq.id)
	}
	delete(m.reqs, id)
	delete(s.routes, id)
}

// expiry is when a routed request's TTL ends. The service keeps them in
// the order they were admitted, which (one TTL for all) is the order of
// their deadlines: expire looks only at the front.
type expiry struct {
	at int64 // Unix ns
	id string
	m  *modelRouter
}

// expectExpiry queues a request's deadline (s.mu held), compacting the
// queue when mostly requests already completed wait in it.
func (s *Service) expectExpiry(e expiry) {
	s.expiries = append(s.expiries, e)
	if live := len(s.routes); len(s.expiries) > 2*live+1024 {
		kept := s.expiries[:0]
		for _, e := range s.expiries {
			if s.routes[e.id] == e.m {
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
			s.mu.Lock()
			n := 0
			for ; n < len(s.expiries) && now.UnixNano() > s.expiries[n].at; n++ {
				e := s.expiries[n]
				if s.routes[e.id] != e.m {
					continue // completed, freed, or reused on another model
				}
				e.m.mu.Lock()
				if rq := e.m.reqs[e.id]; rq != nil && now.UnixNano() > rq.deadline { // nil: being admitted
					s.forgetRoute(e.m, e.id, rq)
				}
				e.m.mu.Unlock()
			}
			clear(s.expiries[:n])
			s.expiries = s.expiries[n:]
			s.mu.Unlock()
		}
	}
}
