package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
)

func TestParseMode(t *testing.T) {
	for _, m := range []router.Mode{router.RoundRobin, router.KV, router.KVTiers, router.KVApproxLRU, router.KVApproxTTL, router.KVPredict} {
		got, err := router.ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := router.ParseMode("kv_approx"); err == nil {
		t.Error("an unknown mode parsed")
	}
	if _, err := router.New(router.KVApproxLRU, router.DefaultConfig(), 2); err == nil {
		t.Error("kv_approx_lru without a capacity accepted")
	}
}

// route sends a request of the given tokens and returns its worker.
func route(t *testing.T, r *router.Router, id uuid.UUID, tokens []uint32) int {
	t.Helper()
	w, err := r.SelectWorker(context.Background(), router.Request{UUID: id, Tokens: tokens, MaxOutputTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// Without events the approximate modes follow their own decisions: a
// request sharing a long prefix with an earlier one goes where that one
// went, though nobody published a block.
func TestApproximateModesFollowTheirDecisions(t *testing.T) {
	for _, mode := range []router.Mode{router.KVApproxLRU, router.KVApproxTTL} {
		r := newRouter(t, mode, 4, func(c *router.Config) { c.ApproxCapacity = 1000 })
		prompt, id0 := seq(64, 1), uuid.New()
		first := route(t, r, id0, prompt)
		if _, err := r.OnFirstToken(id0); err != nil { // its prefill no longer weighs on its worker
			t.Fatal(err)
		}
		// Events are not read: the one published does not draw requests.
		publishBlocks(t, r, (first+1)%4, prompt, kvevent.TierDevice)
		for i := range 3 {
			id := uuid.New()
			if w := route(t, r, id, append(prompt[:60:60], uint32(1000+i))); w != first {
				t.Fatalf("%v request %d: worker %d, want %d, the first's", mode, i, w, first)
			}
			if ok, err := r.OnComplete(id); !ok || err != nil {
				t.Fatal(ok, err)
			}
		}
		st := r.Stats()
		if st.Index.Unread != 1 || st.Approx.Predictions != 4 || st.Approx.HitBlocks != 3*15 {
			t.Fatalf("%v stats: %+v, approx %+v: want 1 unread event, 4 predictions, 45 hit blocks", mode, st.Index, st.Approx)
		}
		wantLeased := 1 // the first, never completed
		if mode == router.KVApproxTTL {
			wantLeased = 0
		}
		if st.Approx.Leased != wantLeased {
			t.Fatalf("%v: %d leases, want %d", mode, st.Approx.Leased, wantLeased)
		}
	}
}

// An LRU the size of one request (16 prompt blocks and one for its
// output) forgets the first prompt once another is
// routed to the same worker and the first completes.
func TestApproxLRUForgetsWhatDoesNotFit(t *testing.T) {
	r := newRouter(t, router.KVApproxLRU, 1, func(c *router.Config) { c.ApproxCapacity = 17 })
	a, b := seq(64, 1), seq(64, 5000)
	ida := uuid.New()
	route(t, r, ida, a)
	if _, err := r.OnComplete(ida); err != nil {
		t.Fatal(err)
	}
	route(t, r, uuid.New(), b)
	if st := r.Stats(); st.Approx.Evicted != 16 || st.Index.Pairs != 16 {
		t.Fatalf("stats %+v, approx %+v: want 16 evicted, 16 held (b's)", st.Index, st.Approx)
	}
}

// KVPredict: a sibling routed before the first's blocks are published
// follows it; after PredictTTL only events count.
func TestPredictFollowsABurstThenExpires(t *testing.T) {
	now := time.Unix(0, 0)
	r := newRouter(t, router.KVPredict, 4, func(c *router.Config) {
		c.PredictTTL = time.Second
		c.Now = func() time.Time { return now }
	})
	prompt := seq(64, 1)
	first := route(t, r, uuid.New(), prompt)
	if w := route(t, r, uuid.New(), prompt); w != first {
		t.Fatalf("sibling went to %d, want %d", w, first)
	}
	now = now.Add(2 * time.Second)
	other := (first + 1) % 4
	publishBlocks(t, r, other, prompt, kvevent.TierDevice)
	if w := route(t, r, uuid.New(), prompt); w != other {
		t.Fatalf("after the predictions expired: worker %d, want %d, the one the events name", w, other)
	}
	if st := r.Stats(); st.Approx.Expired != 16 || st.Index.Unread != 0 {
		t.Fatalf("stats %+v, approx %+v: want 16 expired and every event read", st.Index, st.Approx)
	}
}

// Replicas that predict share their admissions with local hashes: a
// replica predicts another's decision as its own; an admission whose
// local hashes do not chain into its blocks is refused.
func TestApproxReplicasShareDecisions(t *testing.T) {
	var peer *router.Router
	var shared []error
	r := newRouter(t, router.KVApproxLRU, 4, func(c *router.Config) {
		c.ApproxCapacity = 1000
		c.OnAdmit = func(id uuid.UUID, a router.Admission) { shared = append(shared, peer.AdmitRemote(id, a)) }
	})
	peer = newRouter(t, router.KVApproxLRU, 4, func(c *router.Config) { c.ApproxCapacity = 1000 })
	prompt, id := seq(64, 1), uuid.New()
	first := route(t, r, id, prompt)
	if len(shared) != 1 || shared[0] != nil {
		t.Fatalf("admission shared: %v", shared)
	}
	if _, err := peer.OnFirstToken(id); err != nil {
		t.Fatal(err)
	}
	if w := route(t, peer, uuid.New(), prompt); w != first {
		t.Fatalf("the peer routed the prompt to %d, want %d, where the other replica sent it", w, first)
	}
	if st := peer.Stats(); st.Approx.Predictions != 2 || st.Approx.HitBlocks != 16 {
		t.Fatalf("peer's predictions: %+v", st.Approx)
	}
	forged := router.Admission{Worker: kvevent.Worker{ID: 1}, ISL: 8, Blocks: []uint64{1, 2}, Local: []uint64{3, 4}}
	if err := peer.AdmitRemote(uuid.New(), forged); err == nil {
		t.Fatal("an admission whose local hashes do not chain into its blocks accepted")
	}
}
