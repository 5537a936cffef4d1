package router_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/internal/leaks"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
	"github.com/kvradix/kvradix/shardpool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaks.Ignore()...) }

func newRouter(t *testing.T, mode router.Mode, n int, edit func(*router.Config)) *router.Router {
	t.Helper()
	cfg := router.DefaultConfig()
	cfg.BlockSize = 4
	if edit != nil {
		edit(&cfg)
	}
	r, err := router.New(mode, cfg, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown() })
	return r
}

// publishBlocks makes worker w publish the complete blocks of tokens as
// one Stored event (engine hashes = sequence hashes), as an engine would
// after prefill.
func publishBlocks(t *testing.T, r *router.Router, w int, tokens []uint32, tier kvevent.Tier) {
	t.Helper()
	local := hashing.LocalHashes(nil, tokens, 4, hashing.Options{})
	seq := hashing.SequenceHashes(nil, local)
	st := kvevent.Stored{}
	for i := range local {
		st.Blocks = append(st.Blocks, kvevent.StoredBlock{BlockHash: seq[i], TokensHash: local[i]})
	}
	if err := r.Sink(kvevent.WorkerID(w)).PublishWithTier(kvevent.Event{Data: st}, tier); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
}

func seq(n int, start uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = start + uint32(i)
	}
	return out
}

func TestConfigValidation(t *testing.T) {
	edits := map[string]func(*router.Config){
		"block size":  func(c *router.Config) { c.BlockSize = 0 },
		"weight":      func(c *router.Config) { c.OverlapWeight = -1 },
		"temperature": func(c *router.Config) { c.Temperature = -1 },
		"lanes":       func(c *router.Config) { c.IndexerLanes = 0 },
		"weight inf":  func(c *router.Config) { c.OverlapWeight = math.Inf(1) },
		"weight nan":  func(c *router.Config) { c.OverlapWeight = math.NaN() },
		"temp inf":    func(c *router.Config) { c.Temperature = math.Inf(1) },
		"temp nan":    func(c *router.Config) { c.Temperature = math.NaN() },
		"queue inf":   func(c *router.Config) { c.QueueThreshold = math.Inf(1) },
	}
	for name, edit := range edits {
		cfg := router.DefaultConfig()
		edit(&cfg)
		if _, err := router.New(router.KV, cfg, 2); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := router.New(router.KV, router.DefaultConfig(), 0); err == nil {
		t.Error("zero workers accepted")
	}
	if _, err := router.New(router.Mode(7), router.DefaultConfig(), 1); err == nil {
		t.Error("unknown mode accepted")
	}
	d := router.DefaultConfig()
	if d.BlockSize != 16 || d.OverlapWeight != 8 || d.Temperature != 0 || d.IndexerLanes != 2 || d.QueueThreshold != 0 || d.MaxBatchedTokens != 8192 || !d.TrackPrefillTokens {
		t.Errorf("defaults %+v", d)
	}
}

func TestRequestValidation(t *testing.T) {
	for _, mode := range []router.Mode{router.RoundRobin, router.KV} {
		r := newRouter(t, mode, 2, nil)
		ctx := context.Background()
		if _, err := r.SelectWorker(ctx, router.Request{Tokens: seq(8, 0)}); err == nil {
			t.Errorf("%v: request without UUID accepted", mode)
		}
		if _, err := r.SelectWorker(ctx, router.Request{UUID: uuid.New(), MaxOutputTokens: math.MaxUint32 + 1}); err == nil {
			t.Errorf("%v: max output tokens over u32 accepted", mode)
		}
		if _, err := r.SelectWorker(ctx, router.Request{UUID: uuid.New(), MaxOutputTokens: -1}); err == nil {
			t.Errorf("%v: negative max output tokens accepted", mode)
		}
		if err := r.Sink(2).Publish(kvevent.Event{Data: kvevent.Cleared{}}); err == nil {
			t.Errorf("%v: sink of an unknown worker accepted an event", mode)
		}
	}
}

func TestRoundRobinCycles(t *testing.T) {
	r := newRouter(t, router.RoundRobin, 3, nil)
	for i := range 9 {
		w, err := r.SelectWorker(context.Background(), router.Request{UUID: uuid.New(), Tokens: seq(8, 0)})
		if err != nil || w != i%3 {
			t.Fatalf("request %d went to %d (%v)", i, w, err)
		}
	}
	if ok, err := r.OnFirstToken(uuid.New()); ok || err != nil {
		t.Fatalf("OnFirstToken in round robin: %v %v", ok, err)
	}
	if ok, err := r.OnComplete(uuid.New()); ok || err != nil {
		t.Fatalf("OnComplete in round robin: %v %v", ok, err)
	}
	if err := r.Sink(0).Publish(kvevent.Event{Data: kvevent.Cleared{}}); err != nil {
		t.Fatalf("round robin sink: %v", err)
	}
}

// The reference's tier check, through the router.
func TestHostPinnedEventsGiveNoOverlap(t *testing.T) {
	cfg := router.DefaultConfig()
	cfg.BlockSize = 4
	idx := shardpool.NewSingle(4)
	r, err := router.NewWithIndexer(router.KV, cfg, 2, idx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown()
	tokens := seq(32, 1)
	publishBlocks(t, r, 1, tokens, kvevent.TierHostPinned)
	scores, err := idx.FindMatchesForRequest(tokens, "")
	if err != nil || len(scores.Scores) != 0 {
		t.Fatalf("host-pinned blocks scored: %v %v", scores.Scores, err)
	}
	publishBlocks(t, r, 1, tokens, kvevent.TierDevice)
	scores, _ = idx.FindMatchesForRequest(tokens, "")
	if scores.Scores[kvevent.Worker{ID: 1}] != 8 {
		t.Fatalf("device blocks: %v", scores.Scores)
	}
}

func TestKVPrefersLongestPrefixAtEqualLoad(t *testing.T) {
	for _, lanes := range []int{1, 2} {
		r := newRouter(t, router.KV, 4, func(c *router.Config) { c.IndexerLanes = lanes })
		prompt := seq(64, 100)
		publishBlocks(t, r, 1, prompt[:16], kvevent.TierDevice)
		publishBlocks(t, r, 2, prompt[:48], kvevent.TierDevice)
		for i := range 5 {
			id := uuid.New()
			w, err := r.SelectWorker(context.Background(), router.Request{UUID: id, Tokens: prompt})
			if err != nil || w != 2 {
				t.Fatalf("lanes %d request %d: worker %d (%v), want 2", lanes, i, w, err)
			}
			if ok, err := r.OnComplete(id); !ok || err != nil {
				t.Fatal(ok, err)
			}
		}
	}
}

// The pile-up failure: every request shares its first block (as in the
// Mooncake conversation trace). Routing by overlap alone sends them all to
// the worker that cached it first; the scheduler must spread them as its
// load grows.
func TestNoPileUpOnASharedFirstBlock(t *testing.T) {
	const workers, requests = 4, 40
	r := newRouter(t, router.KV, workers, nil)
	system := seq(16, 1) // 4 shared blocks
	counts := make([]int, workers)
	for i := range requests {
		tokens := append(append([]uint32(nil), system...), seq(48, uint32(1000+100*i))...)
		w, err := r.SelectWorker(context.Background(), router.Request{UUID: uuid.New(), Tokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		counts[w]++
		publishBlocks(t, r, w, tokens, kvevent.TierDevice) // requests stay active
	}
	for w, c := range counts {
		if c == 0 || c > requests/2 {
			t.Fatalf("counts %v: worker %d got %d of %d", counts, w, c, requests)
		}
	}
}

func TestLifecycleAndShutdown(t *testing.T) {
	r := newRouter(t, router.KV, 2, nil)
	id := uuid.New()
	if _, err := r.SelectWorker(context.Background(), router.Request{UUID: id, Tokens: seq(20, 0), MaxOutputTokens: 5}); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.OnFirstToken(id); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := r.OnComplete(id); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := r.OnComplete(id); !errors.Is(err, router.ErrUnknownRequest) {
		t.Fatalf("second complete: %v", err)
	}
	publishBlocks(t, r, 0, seq(8, 0), kvevent.TierDevice)
	if err := r.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats().Index; st.Applied != 1 {
		t.Fatalf("stats after shutdown %+v", st)
	}
	if err := r.Sink(0).Publish(kvevent.Event{Data: kvevent.Cleared{}}); !errors.Is(err, router.ErrShutdown) {
		t.Fatalf("publish after shutdown: %v", err)
	}
	if _, err := r.SelectWorker(context.Background(), router.Request{UUID: uuid.New()}); !errors.Is(err, router.ErrShutdown) {
		t.Fatalf("select after shutdown: %v", err)
	}
	if err := r.Flush(); !errors.Is(err, router.ErrShutdown) {
		t.Fatalf("flush after shutdown: %v", err)
	}
	if err := r.Shutdown(); !errors.Is(err, router.ErrShutdown) {
		t.Fatalf("second shutdown: %v", err)
	}
	for _, mode := range []router.Mode{router.KV, router.RoundRobin} {
		r := newRouter(t, mode, 2, nil)
		id := uuid.New()
		if _, err := r.SelectWorker(context.Background(), router.Request{UUID: id, Tokens: seq(20, 0)}); err != nil {
			t.Fatal(err)
		}
		_ = r.Shutdown()
		if ok, err := r.OnFirstToken(id); ok || !errors.Is(err, router.ErrShutdown) {
			t.Fatalf("%v: first token after shutdown: %v %v", mode, ok, err)
		}
		if ok, err := r.OnComplete(id); ok || !errors.Is(err, router.ErrShutdown) {
			t.Fatalf("%v: complete after shutdown: %v %v", mode, ok, err)
		}
	}
}

func TestConcurrentSelectAndComplete(t *testing.T) {
	r := newRouter(t, router.KV, 8, nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				id := uuid.New()
				tokens := seq(32, uint32(g*1000+i%7))
				w, err := r.SelectWorker(context.Background(), router.Request{UUID: id, Tokens: tokens})
				if err != nil {
					t.Error(err)
					return
				}
				local := hashing.LocalHashes(nil, tokens, 4, hashing.Options{})
				st := kvevent.Stored{}
				for j, h := range local {
					st.Blocks = append(st.Blocks, kvevent.StoredBlock{BlockHash: uint64(g)<<32 | uint64(i)<<8 | uint64(j), TokensHash: h})
				}
				if err := r.Sink(kvevent.WorkerID(w)).Publish(kvevent.Event{Data: st}); err != nil {
					t.Error(err)
					return
				}
				if _, err := r.OnFirstToken(id); err != nil {
					t.Error(err)
				}
				if _, err := r.OnComplete(id); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := r.Stats().Active; n != 0 {
		t.Fatalf("%d requests still active", n)
	}
	if st := r.Stats().Index; st.Applied != 1600 || st.Rejected() != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestZeroRouterFails(t *testing.T) {
	var r router.Router
	if _, err := r.SelectWorker(context.Background(), router.Request{UUID: uuid.New()}); err == nil {
		t.Fatal("a zero router selected a worker")
	}
	if err := r.Sink(0).Publish(kvevent.Event{Data: kvevent.Cleared{}}); err == nil {
		t.Fatal("a zero router accepted an event")
	}
}

// With DPSize 2 every (worker, rank) pair is scheduled apart: overlap and
// load count per rank, round robin cycles the pairs, and a worker id alone
// is refused.
func TestDPRanks(t *testing.T) {
	r := newRouter(t, router.KV, 2, func(c *router.Config) { c.DPSize = 2 })
	prompt := seq(64, 7)
	local := hashing.LocalHashes(nil, prompt[:32], 4, hashing.Options{})
	sh := hashing.SequenceHashes(nil, local)
	st := kvevent.Stored{}
	for i := range local {
		st.Blocks = append(st.Blocks, kvevent.StoredBlock{BlockHash: sh[i], TokensHash: local[i]})
	}
	if err := r.Sink(1).Publish(kvevent.Event{DPRank: 1, Data: st}); err != nil {
		t.Fatal(err)
	}
	if err := r.Sink(1).Publish(kvevent.Event{DPRank: 2, Data: st}); err == nil {
		t.Fatal("rank 2 accepted with dp size 2")
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w, err := r.SelectWorkerRank(ctx, router.Request{UUID: uuid.New(), Tokens: prompt})
	if err != nil || w != (kvevent.Worker{ID: 1, DPRank: 1}) {
		t.Fatalf("cached on 1/1: chose %v (%v)", w, err)
	}
	if _, err := r.SelectWorker(ctx, router.Request{UUID: uuid.New(), Tokens: prompt}); err == nil {
		t.Fatal("SelectWorker answered a worker id with dp size 2")
	}
	// Load counts per rank: uncached requests of equal size, each kept
	// active, land on four distinct pairs.
	seen := map[kvevent.Worker]bool{}
	for i := range 4 {
		w, err := r.SelectWorkerRank(ctx, router.Request{UUID: uuid.New(), Tokens: seq(64, uint32(10_000*(i+1)))})
		if err != nil {
			t.Fatal(err)
		}
		seen[w] = true
	}
	if len(seen) != 4 {
		t.Fatalf("four equal requests on %d pairs: %v", len(seen), seen)
	}
	if st := r.Stats(); st.DPSize != 2 || st.Workers != 2 || st.Active != 5 || st.IndexerLanes != 2 {
		t.Fatalf("stats %+v", st)
	}
	rr := newRouter(t, router.RoundRobin, 2, func(c *router.Config) { c.DPSize = 2 })
	var got []kvevent.Worker
	for range 5 {
		w, err := rr.SelectWorkerRank(ctx, router.Request{UUID: uuid.New()})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, w)
	}
	want := []kvevent.Worker{{ID: 0}, {ID: 0, DPRank: 1}, {ID: 1}, {ID: 1, DPRank: 1}, {ID: 0}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("round robin %v, want %v", got, want)
		}
	}
	for _, bad := range []int{-1, router.MaxDPSize + 1} {
		cfg := router.DefaultConfig()
		cfg.DPSize = bad
		if _, err := router.New(router.KV, cfg, 1); err == nil {
			t.Errorf("dp size %d accepted", bad)
		}
	}
}

// NewWithIndexer: the router uses the caller's indexer, owns it (Shutdown
// closes it), and refuses a mode and indexer that do not go together.
func TestNewWithIndexer(t *testing.T) {
	cfg := router.DefaultConfig()
	cfg.BlockSize = 4
	if _, err := router.NewWithIndexer(router.KV, cfg, 2, nil); err == nil {
		t.Error("KV mode without an indexer accepted")
	}
	single := shardpool.NewSingle(4)
	defer single.Close()
	if _, err := router.NewWithIndexer(router.RoundRobin, cfg, 2, single); err == nil {
		t.Error("round robin with an indexer accepted")
	}
	pool := shardpool.NewPool(3, 4)
	r, err := router.NewWithIndexer(router.KV, cfg, 2, pool)
	if err != nil {
		t.Fatal(err)
	}
	publishBlocks(t, r, 1, seq(16, 1), kvevent.TierDevice)
	if st := r.Stats(); st.IndexerLanes != 3 || st.Index.Applied != 1 || st.Mode != router.KV {
		t.Fatalf("stats %+v", st)
	}
	if err := r.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Flush(); !errors.Is(err, shardpool.ErrClosed) {
		t.Fatalf("the indexer after Shutdown: %v, want closed", err)
	}
	if st := newRouter(t, router.RoundRobin, 2, nil).Stats(); st.IndexerLanes != 0 || st.Active != 0 || st.DPSize != 1 {
		t.Fatalf("round robin stats %+v", st)
	}
	if st := newRouter(t, router.KV, 2, func(c *router.Config) { c.IndexerLanes = 1 }).Stats(); st.IndexerLanes != 1 {
		t.Fatalf("single stats %+v", st)
	}
}

// A request admitted by another replica counts in this router's load: its
// next equal request goes to the other worker, and the remote request is
// released by id like a local one.
func TestAdmitRemote(t *testing.T) {
	var seen []router.Admission
	a := newRouter(t, router.KV, 2, func(c *router.Config) {
		c.OnAdmit = func(_ uuid.UUID, ad router.Admission) { seen = append(seen, ad) }
	})
	b := newRouter(t, router.KV, 2, nil)
	ctx := context.Background()
	x := uuid.New()
	w, err := a.SelectWorkerRank(ctx, router.Request{UUID: x, Tokens: seq(64, 1)})
	if err != nil || len(seen) != 1 || seen[0].Worker != w || seen[0].ISL != 64 || len(seen[0].Blocks) != 16 {
		t.Fatalf("admission %v (%v): %+v", w, err, seen)
	}
	if err := b.AdmitRemote(x, seen[0]); err != nil {
		t.Fatal(err)
	}
	if err := b.AdmitRemote(x, seen[0]); err == nil {
		t.Fatal("a duplicate remote admission was accepted")
	}
	if st := b.Stats(); st.Active != 1 {
		t.Fatalf("remote load not counted: %+v", st)
	}
	for i := range 3 { // equal requests, each released: all avoid the loaded worker
		id := uuid.New()
		got, err := b.SelectWorkerRank(ctx, router.Request{UUID: id, Tokens: seq(64, uint32(1000*(i+1)))})
		if err != nil || got == w {
			t.Fatalf("request %d on %v (%v), the remotely loaded worker is %v", i, got, err, w)
		}
		if _, err := b.OnComplete(id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.OnComplete(x); err != nil || b.Stats().Active != 0 {
		t.Fatalf("release: %v, %+v", err, b.Stats())
	}
	rr := newRouter(t, router.RoundRobin, 2, nil)
	if err := rr.AdmitRemote(x, seen[0]); err == nil {
		t.Fatal("round robin took remote load")
	}
}

// A prompt given as its local hashes routes exactly as its tokens do,
// request after request (the load each admission adds included); hashes
// that do not make the stated prompt length are refused.
func TestPrehashedPromptRoutesAsTokens(t *testing.T) {
	byTokens, byHashes := newRouter(t, router.KV, 4, nil), newRouter(t, router.KV, 4, nil)
	for w, n := range []int{0, 8, 24, 40} {
		for _, r := range []*router.Router{byTokens, byHashes} {
			if n > 0 {
				publishBlocks(t, r, w, seq(n, 100), kvevent.TierDevice)
			}
		}
	}
	for i := range 20 {
		prompt := seq(30+i%13, 100)
		local := hashing.LocalHashes(nil, prompt, 4, hashing.Options{})
		id := uuid.New()
		a, errA := byTokens.SelectWorker(context.Background(), router.Request{UUID: id, Tokens: prompt, MaxOutputTokens: 10})
		b, errB := byHashes.SelectWorker(context.Background(), router.Request{UUID: id, Local: local, PromptTokens: len(prompt), MaxOutputTokens: 10})
		if a != b || errA != nil || errB != nil {
			t.Fatalf("request %d: worker %d (%v) by tokens, %d (%v) by hashes", i, a, errA, b, errB)
		}
	}
	local := hashing.LocalHashes(nil, seq(12, 100), 4, hashing.Options{})
	for _, n := range []int{11, 16, 0} {
		if _, err := byHashes.SelectWorker(context.Background(), router.Request{UUID: uuid.New(), Local: local, PromptTokens: n}); err == nil {
			t.Errorf("3 blocks of 4 tokens accepted as a %d-token prompt", n)
		}
	}
}

// kv_tiers routes to a prompt held on the host (12 blocks at 0.8) over a
// worker holding fewer on the device (8), where kv, blind to the host,
// does the opposite; its Stats give the weights. A kv_tiers router over an
// indexer that keeps no tiers is refused.
func TestKVTiersRoutesToTheHost(t *testing.T) {
	prompt := seq(48, 100)
	for _, tc := range []struct {
		mode router.Mode
		want int
	}{{router.KV, 2}, {router.KVTiers, 1}} {
		r := newRouter(t, tc.mode, 3, func(c *router.Config) { c.IndexerLanes = 1 })
		publishBlocks(t, r, 1, prompt, kvevent.TierHostPinned)
		publishBlocks(t, r, 2, prompt[:32], kvevent.TierDevice)
		w, err := r.SelectWorker(context.Background(), router.Request{UUID: uuid.New(), Tokens: prompt})
		if err != nil || w != tc.want {
			t.Fatalf("%v: worker %d (%v), want %d", tc.mode, w, err, tc.want)
		}
		if st := r.Stats(); (tc.mode == router.KVTiers) != (st.TierWeights == router.DefaultTierWeights) {
			t.Fatalf("%v: stats' tier weights %v", tc.mode, st.TierWeights)
		}
	}
	pool := shardpool.NewPool(2, 16)
	defer pool.Close()
	if _, err := router.NewWithIndexer(router.KVTiers, router.DefaultConfig(), 2, pool); err == nil {
		t.Fatal("kv_tiers over a pool that keeps no tiers was taken")
	}
}
