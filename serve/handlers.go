package serve

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// Handler returns the service's HTTP API (see the package doc).
//
// With Config.Token, every endpoint that changes the service's state
// requires it: /register, /unregister, /route and /requests/{id}/...
// (a route admits load; a release frees it). Reads stay open: /query,
// /query_by_hash, /workers, /dump, /metrics, /health. Every POST must say
// its body is JSON (415 otherwise: a browser's form or text/plain POST,
// which needs no preflight, is refused), and requests a browser marks as
// cross-origin are refused (403), so a web page cannot drive the service
// through its visitor's browser. Every error is JSON, a path the API does
// not have (404) and a method a path does not take (405) included.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	// Endpoints that answer data refuse a query they cannot honour (400):
	// a filter they ignored would read as "everything". Probes and
	// /metrics take what they are sent.
	handle := func(pattern string, h http.HandlerFunc, keys ...string) {
		mux.HandleFunc(pattern, takes(h, keys...))
	}
	handle("POST /register", s.guarded(s.register))
	handle("POST /unregister", s.guarded(s.unregister))
	handle("GET /workers", s.workers, "model_name", "routing_group", "tenant_id")
	handle("POST /register_peer", s.guarded(s.peerChange(s.RegisterPeer, http.StatusCreated)))
	handle("POST /deregister_peer", s.guarded(s.peerChange(s.DeregisterPeer, http.StatusOK)))
	handle("GET /peers", func(w http.ResponseWriter, _ *http.Request) { reply(w, http.StatusOK, s.Peers()) })
	handle("POST /route", s.guarded(s.route))
	handle("POST /requests/{id}/first_token", s.guarded(s.release(false)))
	handle("POST /requests/{id}/complete", s.guarded(s.release(true)))
	handle("POST /query", s.query)
	handle("POST /query_by_hash", s.queryByHash)
	handle("GET /dump", s.dump)
	mux.Handle("GET /metrics", s.metrics.handler())
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := s.Ready(); !ok {
			reply(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": why})
			return
		}
		reply(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fail(w, http.StatusForbidden, errors.New("cross-origin request refused"))
	}))
	return cop.Handler(jsonOnly(s.bounded(jsonMisses(mux))))
}

func (s *Service) workers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	group, tenant := q.Get("routing_group"), q.Get("tenant_id")
	if group != "" && tenant != "" && group != tenant {
		fail(w, http.StatusBadRequest, fmt.Errorf("query: routing_group %q and tenant_id %q differ (they are synonyms)", group, tenant))
		return
	}
	reply(w, http.StatusOK, s.Workers(q.Get("model_name"), cmp.Or(group, tenant)))
}

// takes refuses (400, naming it) a query the endpoint cannot honour: one
// that does not parse, a key not in keys, or a key given more than once.
func takes(h http.HandlerFunc, keys ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := checkQuery(r.URL.RawQuery, keys); err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		h(w, r)
	}
}

func checkQuery(raw string, keys []string) error {
	if raw == "" {
		return nil
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return fmt.Errorf("query: %w", err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		switch {
		case len(keys) == 0:
			return fmt.Errorf("query: parameter %q: this endpoint takes none", k)
		case !slices.Contains(keys, k):
			return fmt.Errorf("query: unknown parameter %q (this endpoint takes %s)", k, strings.Join(keys, ", "))
		case len(q[k]) > 1:
			return fmt.Errorf("query: parameter %q given %d times", k, len(q[k]))
		}
	}
	return nil
}

// jsonMisses answers a request no endpoint takes as every other error is
// answered, in JSON: 404 for a path the API does not have, 405 (with the
// mux's Allow header) for a method the path does not take. The mux's
// redirects to a cleaned path pass through.
func jsonMisses(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, pattern := mux.Handler(r); pattern == "" {
			h.ServeHTTP(&missWriter{ResponseWriter: w, r: r}, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// missWriter turns the mux's plain-text 404 and 405 into JSON errors.
type missWriter struct {
	http.ResponseWriter
	r        *http.Request
	answered bool
}

func (m *missWriter) WriteHeader(code int) {
	var err error
	switch code {
	case http.StatusNotFound:
		err = fmt.Errorf("no endpoint %s %s", m.r.Method, m.r.URL.Path)
	case http.StatusMethodNotAllowed:
		err = fmt.Errorf("%s %s: method not allowed (allowed: %s)", m.r.Method, m.r.URL.Path, m.Header().Get("Allow"))
	default:
		m.ResponseWriter.WriteHeader(code)
		return
	}
	fail(m.ResponseWriter, code, err)
	m.answered = true
}

func (m *missWriter) Write(p []byte) (int, error) {
	if m.answered {
		return len(p), nil // the mux's text, replaced
	}
	return m.ResponseWriter.Write(p)
}

// Large bodies: a request whose body is over largeBody, or of unknown
// length, waits for one of largeBodies slots for as long as it is being
// served (its body and what it decodes to, several times its size, are
// live until then), so that concurrent clients cannot make the service
// hold more than largeBodies maximal requests at once.
const (
	largeBody   = 1 << 20
	largeBodies = 2
	largeWait   = 10 * time.Second
)

func (s *Service) bounded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && (r.ContentLength > largeBody || r.ContentLength < 0) {
			select {
			case s.large <- struct{}{}:
				defer func() { <-s.large }()
			case <-r.Context().Done():
				return
			case <-time.After(largeWait):
				fail(w, http.StatusServiceUnavailable, fmt.Errorf("body: %d large requests being served; try again", largeBodies))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// jsonOnly refuses a POST whose Content-Type is not application/json.
func jsonOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
			if !strings.EqualFold(strings.TrimSpace(ct), "application/json") {
				fail(w, http.StatusUnsupportedMediaType, fmt.Errorf("content-type: %q, want application/json", r.Header.Get("Content-Type")))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// guarded requires Config.Token, if set, of the caller of an endpoint that
// changes the service's state, and holds the call while the service
// recovers (see holding).
func (s *Service) guarded(h http.HandlerFunc) http.HandlerFunc {
	want := "Bearer " + s.cfg.Token
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte(want)) != 1 {
			fail(w, http.StatusUnauthorized, errors.New("authorization: a bearer token is required"))
			return
		}
		if !s.holding(w) {
			h(w, r)
		}
	}
}

// holding answers 503, with Config.HoldWhileRecovering until Recover has
// run, and reports whether it did.
func (s *Service) holding(w http.ResponseWriter) bool {
	if !s.cfg.HoldWhileRecovering || !s.recovering.Load() {
		return false
	}
	w.Header().Set("Retry-After", "1")
	fail(w, http.StatusServiceUnavailable, errors.New("recovering the saved state: try again once /ready answers 200"))
	return true
}

func (s *Service) register(w http.ResponseWriter, r *http.Request) {
	var reg Registration
	if !s.decode(w, r, &reg) {
		return
	}
	if err := s.Register(reg); err != nil {
		fail(w, status(err), err)
		return
	}
	reply(w, http.StatusCreated, map[string]string{"status": "ok"})
}

// Peer is a POST /register_peer or /deregister_peer body.
type Peer struct {
	URL string `json:"url"`
}

// peerChange serves /register_peer or /deregister_peer: change applied
// to the body's url, answered with code.
func (s *Service) peerChange(change func(url string) error, code int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var p Peer
		if !s.decode(w, r, &p) {
			return
		}
		if err := change(p.URL); err != nil {
			fail(w, status(err), err)
			return
		}
		reply(w, code, map[string]string{"status": "ok"})
	}
}

// tenantOr names the default tenant for "".
func tenantOr(t string) string {
	if t == "" {
		return DefaultTenant
	}
	return t
}

func (s *Service) unregister(w http.ResponseWriter, r *http.Request) {
	var u Unregistration
	if !s.decode(w, r, &u) {
		return
	}
	if u.ModelName == "" {
		fail(w, http.StatusBadRequest, errors.New("model_name: missing"))
		return
	}
	if err := s.Unregister(u); err != nil {
		fail(w, status(err), err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Query is a POST /query body.
type Query struct {
	TokenIDs     []uint32 `json:"token_ids"`
	ModelName    string   `json:"model_name"`
	TenantID     string   `json:"tenant_id,omitempty"`
	RoutingGroup string   `json:"routing_group,omitempty"` // Dynamo's name of the partition; tenant_id is its synonym
	LoRAName     string   `json:"lora_name,omitempty"`
	// CacheSalt matches blocks engines stored under this cache_salt
	// (SGLang's salted stores, vLLM's map events): without it, salted
	// blocks never match.
	CacheSalt string `json:"cache_salt,omitempty"`
}

func (x *Query) partition() (*string, string) { return &x.TenantID, x.RoutingGroup }

// HashQuery is a POST /query_by_hash body: local (tokens) block hashes.
type HashQuery struct {
	BlockHashes  Hashes `json:"block_hashes"`
	ModelName    string `json:"model_name"`
	TenantID     string `json:"tenant_id,omitempty"`
	RoutingGroup string `json:"routing_group,omitempty"` // Dynamo's name of the partition; tenant_id is its synonym
	// CacheSalt is refused, as Dynamo refuses it: the hashes must already
	// carry the salt (hashing.Options.Salt).
	CacheSalt *string `json:"cache_salt,omitempty"`
}

func (x *HashQuery) partition() (*string, string) { return &x.TenantID, x.RoutingGroup }

// Hashes are block hashes as JSON numbers, unsigned or signed: Dynamo's
// clients send hashes of 2^63 and over as negative int64s, which are read
// as the same 64 bits. They are written unsigned.
type Hashes []uint64

// UnmarshalJSON reads an array of integers (or null), each from -2^63 to
// 2^64-1, naming the element it refuses.
func (h *Hashes) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		*h = nil
		return nil
	}
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return shapeError{errors.New("block_hashes: want an array of integers")}
	}
	out := (*h)[:0]
	if out == nil {
		out = Hashes{} // present, even if empty
	}
	if inner := bytes.TrimSpace(b[1 : len(b)-1]); len(inner) > 0 {
		for num := range bytes.SplitSeq(inner, []byte{','}) {
			v, err := parseHash(string(bytes.TrimSpace(num)))
			if err != nil {
				return shapeError{fmt.Errorf("block_hashes[%d]: %w", len(out), err)}
			}
			out = append(out, v)
		}
	}
	*h = out
	return nil
}

// parseHash reads a hash written unsigned, or signed as an int64.
func parseHash(s string) (uint64, error) {
	if v, err := strconv.ParseUint(s, 10, 64); err == nil {
		return v, nil
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil && v < 0 {
		return uint64(v), nil
	}
	return 0, fmt.Errorf("%q is not an integer from -2^63 to 2^64-1", s)
}

// Scores is a query's answer: Dynamo's (scores, frequencies, instances)
// and kvradix's (tree_sizes, tier_scores).
type Scores struct {
	Scores      map[string]map[string]uint64 `json:"scores"` // instance -> rank -> matched tokens
	Frequencies []int                        `json:"frequencies"`
	// Instances is Dynamo's per-instance summary (Mooncake's RFC #1403),
	// in matched tokens: dp, each rank's device prefix; gpu, the longest
	// of them; cpu, the longest device-or-host prefix; disk, the longest
	// prefix in any tier (external storage counts as disk);
	// longest_matched, the longest of the three. Without Config.Tiers only
	// the device is indexed, and cpu and disk equal gpu.
	Instances map[string]Instance       `json:"instances"`
	TreeSizes map[string]map[string]int `json:"tree_sizes"` // instance -> rank -> blocks held
	// TierScores, with Config.Tiers, is instance -> rank -> tier (device,
	// host_pinned, disk, external) -> the tokens matched in that tier or a
	// nearer one (device <= host_pinned <= disk <= external).
	TierScores map[string]map[string]map[string]uint64 `json:"tier_scores,omitempty"`
}

func (s *Service) query(w http.ResponseWriter, r *http.Request) {
	var q Query
	if !s.decode(w, r, &q) {
		return
	}
	s.answer(w, "query", "token_ids", len(q.TokenIDs), q.ModelName, q.TenantID, func(idx *index) ([]uint64, radix.OverlapScores, int, error) {
		// The tier lookup and the predictions need the hashes too.
		if idx.tiers || q.CacheSalt != "" || len(idx.pred.state.Load().routed) > 0 {
			local := hashing.LocalHashes(nil, q.TokenIDs, idx.blockSize, hashing.Options{LoRAName: q.LoRAName, Salt: q.CacheSalt})
			res, _, _, _, err := idx.match(local, false)
			return local, res, len(local), err
		}
		res, err := idx.pool.FindMatchesForRequest(q.TokenIDs, q.LoRAName)
		return nil, res, len(q.TokenIDs) / idx.blockSize, err
	})
}

func (s *Service) queryByHash(w http.ResponseWriter, r *http.Request) {
	var q HashQuery
	if !s.decode(w, r, &q) {
		return
	}
	if q.CacheSalt != nil {
		fail(w, http.StatusBadRequest, errors.New("cache_salt: not accepted by /query_by_hash; block_hashes must already include the cache salt"))
		return
	}
	s.answer(w, "query_by_hash", "block_hashes", len(q.BlockHashes), q.ModelName, q.TenantID, func(idx *index) ([]uint64, radix.OverlapScores, int, error) {
		res, _, _, _, err := idx.match(q.BlockHashes, false)
		return q.BlockHashes, res, len(q.BlockHashes), err
	})
}

// answer serves one query: field's n items within MaxTokens, the model's
// index, match (the local hashes, their overlap and the blocks asked
// about), with tiers the tier scores, the metrics, the reply in tokens.
func (s *Service) answer(w http.ResponseWriter, endpoint, field string, n int, model, tenant string, match func(*index) ([]uint64, radix.OverlapScores, int, error)) {
	if n > s.cfg.MaxTokens {
		fail(w, http.StatusBadRequest, fmt.Errorf("%s: %d, at most %d", field, n, s.cfg.MaxTokens))
		return
	}
	idx, err := s.lookup(model, tenant)
	if err != nil {
		fail(w, status(err), err)
		return
	}
	start := time.Now()
	local, res, blocks, err := match(idx)
	var tiers radix.TierScores
	if err == nil && idx.tiers {
		tiers, err = idx.pool.FindTierMatches(local)
	}
	if err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	s.metrics.observeQuery(endpoint, model, tenant, start, blocks, res)
	a := answerBufs.Get().(*answerBuf)
	a.appendScores(res, tiers, idx.blockSize)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(a.b)
	answerBufs.Put(a)
}

// answerBuf is a query's answer being written; pooled, so that answering
// allocates little.
type answerBuf struct {
	b       []byte
	workers []kvevent.Worker
	all     []kvevent.Worker
	counts  []int
}

var answerBufs = sync.Pool{New: func() any { return new(answerBuf) }}

// appendScores writes the JSON of the query answer (Scores) for res into
// a.b: scores in tokens per instance and rank, frequencies[i] the workers
// holding the request's block i, tree sizes in blocks. Instances and
// ranks come in numeric order.
func (a *answerBuf) appendScores(res radix.OverlapScores, tiers radix.TierScores, blockSize int) {
	ws := sortedWorkers(a.workers[:0], maps.Keys(res.Scores))
	b := append(a.b[:0], `{"scores":`...)
	b = appendByInstance(b, ws, func(b []byte, wk kvevent.Worker) []byte {
		return strconv.AppendUint(b, uint64(res.Scores[wk])*uint64(blockSize), 10)
	})
	b = append(b, `,"frequencies":[`...)
	// counts[n]: workers holding exactly n leading blocks; then
	// frequencies[i] = the workers holding more than i.
	counts := a.counts[:0]
	for _, wk := range ws {
		n := int(res.Scores[wk])
		for len(counts) <= n {
			counts = append(counts, 0)
		}
		counts[n]++
	}
	for i := len(counts) - 2; i >= 0; i-- {
		counts[i] += counts[i+1]
	}
	for i := 1; i < len(counts); i++ {
		if i > 1 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(counts[i]), 10)
	}
	b = append(b, `],"tree_sizes":`...)
	b = appendByInstance(b, ws, func(b []byte, wk kvevent.Worker) []byte {
		return strconv.AppendInt(b, int64(res.TreeSizes[wk]), 10)
	})
	all := ws
	if tiers.Scores != nil { // a worker may hold the first block in another tier only
		all = a.all[:0]
		for _, wk := range ws {
			if _, ok := tiers.Scores[wk]; !ok {
				all = append(all, wk)
			}
		}
		all = sortedWorkers(all, maps.Keys(tiers.Scores))
		a.all = all
	}
	b = appendInstances(b, all, res, tiers, blockSize)
	if tiers.Scores != nil {
		ws = sortedWorkers(ws[:0], maps.Keys(tiers.Scores))
		b = append(b, `,"tier_scores":`...)
		b = appendByInstance(b, ws, func(b []byte, wk kvevent.Worker) []byte {
			for i, n := range tiers.Scores[wk] {
				if i == 0 {
					b = append(b, '{')
				} else {
					b = append(b, ',')
				}
				b = strconv.AppendQuote(b, kvevent.Tier(i).String())
				b = append(b, ':')
				b = strconv.AppendUint(b, uint64(n)*uint64(blockSize), 10)
			}
			return append(b, '}')
		})
	}
	a.b, a.workers, a.counts = append(b, "}\n"...), ws, counts
}

// Instance is one instance's entry in a query's instances.
type Instance struct {
	LongestMatched uint64            `json:"longest_matched"`
	GPU            uint64            `json:"gpu"`
	DP             map[string]uint64 `json:"dp"`
	CPU            uint64            `json:"cpu"`
	Disk           uint64            `json:"disk"`
}

// appendInstances writes "instances": Dynamo's per-instance summary of
// the workers ws (sorted by instance and rank), in tokens.
func appendInstances(b []byte, ws []kvevent.Worker, res radix.OverlapScores, tiers radix.TierScores, blockSize int) []byte {
	b = append(b, `,"instances":{`...)
	for i := 0; i < len(ws); {
		j := i
		var gpu, cpu, disk uint64
		for ; j < len(ws) && ws[j].ID == ws[i].ID; j++ {
			g := uint64(res.Scores[ws[j]])
			c, d := g, g
			if ts, ok := tiers.Scores[ws[j]]; ok {
				c, d = max(g, uint64(ts[kvevent.TierHostPinned])), max(g, uint64(ts[kvevent.TierExternal]))
			}
			gpu, cpu, disk = max(gpu, g), max(cpu, c), max(disk, d)
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = strconv.AppendUint(b, uint64(ws[i].ID), 10)
		b = append(b, `":{"longest_matched":`...)
		bs := uint64(blockSize)
		b = strconv.AppendUint(b, max(gpu, cpu, disk)*bs, 10)
		b = append(b, `,"gpu":`...)
		b = strconv.AppendUint(b, gpu*bs, 10)
		b = append(b, `,"dp":{`...)
		for k := i; k < j; k++ {
			if k > i {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = strconv.AppendUint(b, uint64(ws[k].DPRank), 10)
			b = append(b, `":`...)
			b = strconv.AppendUint(b, uint64(res.Scores[ws[k]])*bs, 10)
		}
		b = append(b, `},"cpu":`...)
		b = strconv.AppendUint(b, cpu*bs, 10)
		b = append(b, `,"disk":`...)
		b = strconv.AppendUint(b, disk*bs, 10)
		b = append(b, '}')
		i = j
	}
	return append(b, '}')
}

// sortedWorkers appends the workers to dst, by instance and rank.
func sortedWorkers(dst []kvevent.Worker, ws iter.Seq[kvevent.Worker]) []kvevent.Worker {
	dst = slices.AppendSeq(dst, ws)
	slices.SortFunc(dst, func(x, y kvevent.Worker) int {
		return cmp.Or(cmp.Compare(x.ID, y.ID), cmp.Compare(x.DPRank, y.DPRank))
	})
	return dst
}

// appendByInstance appends {"<instance>": {"<rank>": val, ...}, ...} for
// ws, sorted by instance.
func appendByInstance(b []byte, ws []kvevent.Worker, val func([]byte, kvevent.Worker) []byte) []byte {
	b = append(b, '{')
	for i, wk := range ws {
		switch {
		case i == 0:
		case ws[i-1].ID != wk.ID:
			b = append(b, "},"...)
		default:
			b = append(b, ',')
		}
		if i == 0 || ws[i-1].ID != wk.ID {
			b = append(b, '"')
			b = strconv.AppendUint(b, uint64(wk.ID), 10)
			b = append(b, `":{`...)
		}
		b = append(b, '"')
		b = strconv.AppendUint(b, uint64(wk.DPRank), 10)
		b = append(b, `":`...)
		b = val(b, wk)
	}
	if len(ws) > 0 {
		b = append(b, '}')
	}
	return append(b, '}')
}

// dump streams every index's events as JSON. Each index's events are
// written, as they are dumped (under the index's dump lock, which holds its
// writers off for as long as that takes), to an unlinked temporary file,
// then copied from it to the client: a slow reader holds up no writer, and
// the dump costs disk, not memory (a garbage collection every
// dumpGCEvery events keeps the dump's own garbage from growing the heap).
// Dumps run one at a time. An index that cannot catch up within
// dumpSettle (its bus is down) is dumped as it stands and named in the
// X-Kvradix-Stale header.
func (s *Service) dump(w http.ResponseWriter, r *http.Request) {
	if s.holding(w) { // a peer restoring from it would take a part for the whole
		return
	}
	select {
	case s.dumping <- struct{}{}:
		defer func() { <-s.dumping }()
	case <-r.Context().Done():
		return
	}
	s.mu.Lock()
	keys := slices.SortedFunc(maps.Keys(s.indexes), func(a, b modelKey) int {
		return cmp.Or(strings.Compare(a.model, b.model), strings.Compare(a.tenant, b.tenant))
	})
	idxs := make([]*index, len(keys))
	for i, k := range keys {
		idxs[i] = s.indexes[k]
	}
	s.mu.Unlock()
	spill, err := os.CreateTemp("", "kvradix-dump-*")
	if err != nil {
		fail(w, http.StatusInternalServerError, fmt.Errorf("dump: %w", err))
		return
	}
	os.Remove(spill.Name()) // gone with the last descriptor
	defer spill.Close()
	out := bufio.NewWriterSize(spill, 64<<10)
	var stale []string
	out.WriteByte('{')
	for i, idx := range idxs {
		ctx, cancel := context.WithTimeout(r.Context(), dumpSettle)
		err := idx.settle(ctx)
		cancel()
		if err != nil {
			if r.Context().Err() != nil {
				return // the client left
			}
			stale = append(stale, keys[i].String())
		}
		if i > 0 {
			out.WriteByte(',')
		}
		writeIndexJSON(out, keys[i], idx)
	}
	out.WriteString("}\n")
	if err := out.Flush(); err != nil {
		fail(w, http.StatusInternalServerError, fmt.Errorf("dump: %w", err))
		return
	}
	if len(stale) > 0 {
		w.Header().Set("X-Kvradix-Stale", strings.Join(stale, ","))
	}
	size, err := spill.Seek(0, io.SeekCurrent)
	if err == nil {
		_, err = spill.Seek(0, io.SeekStart)
	}
	if err != nil {
		fail(w, http.StatusInternalServerError, fmt.Errorf("dump: %w", err))
		return
	}
	// The server's write timeout ran from the request's arrival, through
	// the spill's making: a dump too big to be written within it was cut
	// midway. It is given its own time instead, at dumpRate.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(dumpWriteTime(size)))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, spill)
}

// A dump is given dumpGrace, and a second more for each dumpRate bytes,
// to be written: a peer reading slower is cut, and frees the dump's slot.
const (
	dumpGrace = 30 * time.Second
	dumpRate  = 1 << 20
)

func dumpWriteTime(size int64) time.Duration {
	return dumpGrace + time.Duration(size/dumpRate)*time.Second
}

// writeIndexJSON writes "<model>:<tenant>": {"block_size": N, "events":
// [...]} to out.
func writeIndexJSON(out *bufio.Writer, k modelKey, idx *index) {
	name, _ := json.Marshal(k.String())
	out.Write(name)
	fmt.Fprintf(out, `:{"block_size":%d,"events":[`, idx.blockSize)
	var buf []byte
	n := 0
	radix.DumpEach(idx.pool.Index(), func(ev kvevent.RouterEvent) {
		if n > 0 {
			buf = append(buf, ',')
		}
		n++
		buf = ev.AppendJSON(buf)
		if len(buf) >= 32<<10 {
			out.Write(buf)
			buf = buf[:0]
		}
		if n%dumpGCEvery == 0 {
			runtime.GC()
		}
	})
	out.Write(buf)
	out.WriteString("]}")
}

// Dump is a GET /dump answer as a client reads it: each index, by
// "<model>:<routing group>", with its block size and its events. It reads
// Dynamo's current shape, {"block_size": N, "events": [...]}, and the
// bare list of events of Dynamo's first standalone indexer (and of
// kvradix before it), whose block size it leaves 0.
type Dump map[string]DumpedIndex

// DumpedIndex is one index of a Dump.
type DumpedIndex struct {
	BlockSize int                   `json:"block_size"`
	Events    []kvevent.RouterEvent `json:"events"`
}

// UnmarshalJSON reads either shape.
func (d *DumpedIndex) UnmarshalJSON(b []byte) error {
	if b = bytes.TrimSpace(b); len(b) > 0 && b[0] == '[' {
		*d = DumpedIndex{}
		return json.Unmarshal(b, &d.Events)
	}
	type plain DumpedIndex
	return json.Unmarshal(b, (*plain)(d))
}

// dumpGCEvery is how many events a dump writes between two garbage
// collections.
const dumpGCEvery = 1 << 17

// dumpSettle bounds how long a dump waits for an index to catch up.
const dumpSettle = 5 * time.Second

// partitioned is a request naming a partition by Dynamo's routing_group,
// kvradix's tenant_id, or both (the same).
type partitioned interface {
	partition() (tenant *string, routingGroup string)
}

// resolvePartition makes routing_group the tenant, refusing a tenant_id
// that differs from it.
func resolvePartition(p partitioned) error {
	t, g := p.partition()
	switch {
	case g == "":
	case *t != "" && *t != g:
		return fmt.Errorf("routing_group %q and tenant_id %q: give one, or the same", g, *t)
	default:
		*t = g
	}
	return nil
}

// bodies are request bodies being read: reused, so that reading one does
// not allocate.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// decode reads a JSON body of at most MaxBodyBytes into v, answering as
// Dynamo's indexer does (axum's JSON extractor) if it cannot, naming the
// field where the decoder says which: 413 for a body over the limit, 400
// for one that is not JSON, 422 for JSON of the wrong shape (a value of
// the wrong type, a required field missing).
func (s *Service) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	buf := bodies.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 64<<10 { // a rare large body is not kept
			bodies.Put(buf)
		}
	}()
	buf.Reset()
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err == nil && buf.Len() == 0 {
		err = io.EOF
	}
	if err == nil {
		err = json.Unmarshal(buf.Bytes(), v) // strings copied: the buffer is reused
	}
	if req, ok := v.(requirer); ok && err == nil {
		if field := req.missing(); field != "" {
			err = shapeError{fmt.Errorf("%s: missing", field)}
		}
	}
	if p, ok := v.(partitioned); ok && err == nil {
		err = resolvePartition(p)
	}
	if err == nil {
		return true
	}
	code := http.StatusBadRequest
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var shape shapeError
	switch {
	case errors.As(err, &tooBig):
		code, err = http.StatusRequestEntityTooLarge, fmt.Errorf("body: larger than %d bytes", tooBig.Limit)
	case errors.As(err, &shape):
		code, err = http.StatusUnprocessableEntity, shape.error
	case errors.As(err, &typeErr):
		code, err = http.StatusUnprocessableEntity, fmt.Errorf("%s: want %v, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case errors.Is(err, io.EOF):
		err = errors.New("body: empty")
	default:
		err = fmt.Errorf("body: %w", err)
	}
	fail(w, code, err)
	return false
}

// shapeError is JSON of the wrong shape that the decoder itself does not
// see: a required field missing, a value a field's own decoder refuses.
type shapeError struct{ error }

// requirer is a body with fields that must be present (Dynamo's required
// fields: a 422 without them).
type requirer interface {
	missing() string // the first required field absent, or ""
}

func (x *Query) missing() string {
	if x.TokenIDs == nil {
		return "token_ids"
	}
	return ""
}

func (x *HashQuery) missing() string {
	if x.BlockHashes == nil {
		return "block_hashes"
	}
	return ""
}

func status(err error) int {
	switch {
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ErrUnknownModel), errors.Is(err, ErrUnknownPeer):
		return http.StatusNotFound
	case errors.Is(err, ErrConflict):
		return http.StatusConflict
	case errors.Is(err, ErrUnreachable):
		return http.StatusBadGateway
	case errors.Is(err, ErrFull), errors.Is(err, ErrClosed):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, err error) {
	reply(w, code, map[string]string{"error": err.Error()})
}
