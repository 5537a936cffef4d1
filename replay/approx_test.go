package replay

import (
	"testing"

	"github.com/kvradix/kvradix/trace"
)

// By hand: the eviction scenario of TestEvictionByHand, routed without
// events. The LRU model of the engine's 20 blocks predicts exactly what the
// engine holds (precision and recall 1); with half the blocks it predicts
// too little of A when C repeats it.
func TestApproxLRUByHand(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 10_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{3, 4}},
		{Timestamp: 20_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
	}
	cfg := small()
	cfg.Blocks = 20
	kv := run(t, reqs, KV, cfg)
	lru := run(t, reqs, KVApproxLRU, cfg)
	if lru.CachedTokens != kv.CachedTokens || kv.CachedTokens != 3*64 {
		t.Fatalf("cached: lru %d, kv %d, want 192 each", lru.CachedTokens, kv.CachedTokens)
	}
	if *lru.ApproxPrecision != 1 || *lru.ApproxRecall != 1 {
		t.Fatalf("lru precision %v recall %v, want 1 and 1", *lru.ApproxPrecision, *lru.ApproxRecall)
	}
	cfg.ApproxCapacity = 0.5 // 10 blocks: the model keeps none of A once B ran
	half := run(t, reqs, KVApproxLRU, cfg)
	if half.ApproxPrecision != nil || *half.ApproxRecall != 0 {
		t.Fatalf("half capacity: precision %v (want none predicted), recall %v (want 0)", half.ApproxPrecision, *half.ApproxRecall)
	}
	if rr := run(t, reqs, RoundRobin, cfg); rr.ApproxPrecision != nil || rr.ApproxRecall != nil {
		t.Fatal("round robin reports an accuracy")
	}
}

// pressedChat is a synthetic chat workload of 600 requests on 4 engines
// of 1,024 blocks: pools that fill, not a fleet overloaded.
func pressedChat(t *testing.T) ([]trace.Request, Config) {
	t.Helper()
	sc := trace.DefaultSynth()
	sc.Requests = 600
	reqs, err := trace.Synthesize(sc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Workers, cfg.Blocks = 4, 1024
	return reqs, cfg
}

// The targets' shape on a synthetic chat workload that fills the pools:
// the LRU model at the true capacity keeps ≥ 0.9 of kv's reuse, with
// precision and recall ≥ 0.9.
func TestApproxLRUTracksKV(t *testing.T) {
	reqs, cfg := pressedChat(t)
	kv := run(t, reqs, KV, cfg)
	lru := run(t, reqs, KVApproxLRU, cfg)
	if kv.ReuseRatio == 0 || lru.ReuseRatio < 0.9*kv.ReuseRatio {
		t.Fatalf("reuse: lru %.3f, kv %.3f: want >= 0.9 of kv's", lru.ReuseRatio, kv.ReuseRatio)
	}
	if *lru.ApproxPrecision < 0.9 || *lru.ApproxRecall < 0.9 {
		t.Fatalf("lru precision %.3f recall %.3f, want >= 0.9", *lru.ApproxPrecision, *lru.ApproxRecall)
	}
	if lru.RejectedEvents != 0 {
		t.Fatalf("%d predicted events rejected", lru.RejectedEvents)
	}
}

// Bursts on a loaded fleet: kv spreads each burst's siblings (it sees no
// block until the first's prefill is stored) and computes the prefix once
// per sibling; kv_predict sends them after the first.
func TestPredictWinsBursts(t *testing.T) {
	bc := trace.DefaultBurst()
	bc.Bursts, bc.Rate = 60, 12
	reqs, err := trace.Bursts(bc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Workers = 4
	kv := run(t, reqs, KV, cfg)
	pred := run(t, reqs, KVPredict, cfg)
	if pred.TTFT.Mean >= kv.TTFT.Mean || pred.ReuseRatio <= kv.ReuseRatio {
		t.Fatalf("kv_predict ttft %.0f ms reuse %.3f, kv %.0f ms %.3f: want lower ttft, more reuse", pred.TTFT.Mean, pred.ReuseRatio, kv.TTFT.Mean, kv.ReuseRatio)
	}
}

func TestApproxSettings(t *testing.T) {
	for _, s := range []string{"approx_capacity=0.5,1,2", "approx_ttl=30,120", "predict_ttl=0.5"} {
		if _, err := ParseSetting(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	if _, err := DefaultConfig().with(SetApproxCapacity, 0); err == nil {
		t.Error("approx_capacity 0 accepted")
	}
	if c, _ := DefaultConfig().with(SetApproxTTL, 0); c.ApproxTTL <= 0 {
		t.Error("approx_ttl 0 became the default")
	}
	if _, err := Sweep(t.Context(), nil, []Setting{{Name: "bogus", Values: []float64{1}}}, DefaultConfig()); err == nil {
		t.Error("an unknown setting swept")
	}
}

// Replicas: two kv_approx_lru routers that share their admissions predict
// from every decision and keep the reuse of one; isolated, each sees half
// the decisions and loses reuse. Bad replica counts are refused.
func TestApproxReplicas(t *testing.T) {
	reqs, cfg := pressedChat(t)
	cfg.Replicas = 2
	shared := run(t, reqs, KVApproxLRU, cfg)
	cfg.Isolated = true
	isolated := run(t, reqs, KVApproxLRU, cfg)
	if shared.ReuseRatio <= isolated.ReuseRatio {
		t.Fatalf("reuse: shared %.3f, isolated %.3f: want shared above", shared.ReuseRatio, isolated.ReuseRatio)
	}
	if rr := run(t, reqs, RoundRobin, cfg); rr.Completed != len(reqs) {
		t.Fatalf("round robin over isolated replicas completed %d of %d", rr.Completed, len(reqs))
	}
	for _, n := range []int{0, MaxReplicas + 1} {
		cfg.Replicas = n
		if err := cfg.Validate(); err == nil {
			t.Errorf("%d replicas accepted", n)
		}
	}
}
