package replay

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/trace"
)

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*max(1, math.Abs(want)) {
		t.Errorf("%s = %.12g, want %.12g", what, got, want)
	}
}

func small() Config {
	c := DefaultConfig()
	c.Workers, c.Blocks, c.BlockSize = 1, 100, 64
	return c
}

func run(t *testing.T, reqs []trace.Request, name string, cfg Config) Result {
	t.Helper()
	res, err := Run(reqs, name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestStepModel(t *testing.T) {
	near(t, "PrefillMs(0)", PrefillMs(0), 16.50142)
	near(t, "PrefillMs(1000)", PrefillMs(1000), 0.4209989+15.18344+16.50142)
	near(t, "DecodeMs(0)", DecodeMs(0), 5.74)
	near(t, "DecodeMs(1)", DecodeMs(1), -25.74+54.01+5.74)
	near(t, "DecodeMs(3) floor", DecodeMs(3), 1)
}

// One request on one engine, by hand (a pool of 6400 tokens): a 128-token
// prompt is one step, its prefill then the decode iteration that makes its
// first token: PrefillMs(128) + DecodeMs(128/6400); two decode steps at p =
// 129/6400 and 130/6400 take 6.818181559082031 and 6.826457861328125 ms.
func TestOneRequestByHand(t *testing.T) {
	res := run(t, []trace.Request{{InputLength: 128, OutputLength: 3, HashIDs: []uint64{1}}}, RoundRobin, small())
	ttft := 18.4517979659776 + DecodeMs(128.0/6400)
	e2e := ttft + 6.818181559082031 + 6.826457861328125
	near(t, "ttft", res.TTFT.Mean, ttft)
	near(t, "e2e", res.E2E.Mean, e2e)
	near(t, "tpot", res.TPOT.Mean, 6.822319710205078)
	near(t, "itl p99", res.ITL.P99, 6.826457861328125)
	near(t, "itl p50", res.ITL.P50, 6.818181559082031)
	if res.Completed != 1 || res.OutputTokens != 3 || res.ReuseRatio != 0 || res.PromptTokens != 128 {
		t.Fatalf("%+v", res)
	}
	near(t, "throughput", res.ThroughputTPS, 3/(e2e/1000))
}

// Chunked prefill: 1024 prompt tokens at 256 tokens a step take four
// prefill steps, the last with the decode iteration of the first token.
func TestChunkedPrefill(t *testing.T) {
	cfg := small()
	cfg.MaxBatchedTokens = 256
	res := run(t, []trace.Request{{InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}}}, RoundRobin, cfg)
	near(t, "ttft", res.TTFT.Mean, 4*PrefillMs(256)+DecodeMs(1024.0/6400))
	if res.TPOT != (Dist{}) || res.ITL != (Dist{}) {
		t.Fatalf("one output token has no TPOT or ITL: %+v", res)
	}
}

// A step that mixes prefill and decode costs both models, as the reference
// mocker's pass: B's prefill joins A's decode, and A's token waits for it.
func TestMixedStepCostsBoth(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 128, OutputLength: 3, HashIDs: []uint64{1}},
		{Timestamp: 20, InputLength: 256, OutputLength: 1, HashIDs: []uint64{2}},
	}
	res := run(t, reqs, RoundRobin, small())
	// A's first step ends at t1; B arrived meanwhile, so step 2 carries B's
	// 256-token prefill and A's decode (p counts A's 129 tokens and B's 256).
	t1 := PrefillMs(128) + DecodeMs(128.0/6400)
	step2 := PrefillMs(256) + DecodeMs((129.0+256)/6400)
	near(t, "itl p99 (the mixed step)", res.ITL.P99, step2)
	near(t, "ttft of B", res.TTFT.P99, t1+step2-20)
}

// Prefix reuse: B shares A's first trace block (512 tokens = 8 blocks of
// 64) and arrives after A finished: 512 of B's 1024 tokens are cached,
// so reuse is 512/2048.
func TestPrefixReuse(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 2, HashIDs: []uint64{1, 2}},
		{Timestamp: 10_000, InputLength: 1024, OutputLength: 2, HashIDs: []uint64{1, 3}},
	}
	res := run(t, reqs, RoundRobin, small())
	if res.CachedTokens != 512 || res.PromptTokens != 2048 || res.ReuseRatio != 0.25 {
		t.Fatalf("%+v", res)
	}
	// B prefills only its 512 uncached tokens.
	near(t, "ttft mean", res.TTFT.Mean, (PrefillMs(1024)+PrefillMs(512))/2+DecodeMs(1024.0/6400))
}

// A fully cached prompt still computes its last token, as vLLM does.
func TestFullyCachedPromptRecomputesOne(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 512, OutputLength: 1, HashIDs: []uint64{1}},
		{Timestamp: 10_000, InputLength: 512, OutputLength: 1, HashIDs: []uint64{1}},
	}
	res := run(t, reqs, RoundRobin, small())
	if res.CachedTokens != 448 {
		t.Fatalf("cached %d, want 7 blocks = 448", res.CachedTokens)
	}
}

// Routing: A, B and C share their first trace block and arrive one after
// another on two idle workers. Round robin puts B on the other worker (no
// reuse) and C back with A (512 cached); KV routing keeps all three on one
// worker (512 + 512 cached).
func TestKVRoutingBuysReuse(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 2, HashIDs: []uint64{1, 2}},
		{Timestamp: 10_000, InputLength: 1024, OutputLength: 2, HashIDs: []uint64{1, 3}},
		{Timestamp: 20_000, InputLength: 1024, OutputLength: 2, HashIDs: []uint64{1, 4}},
	}
	cfg := small()
	cfg.Workers = 2
	rr := run(t, reqs, RoundRobin, cfg)
	kv := run(t, reqs, KV, cfg)
	if rr.CachedTokens != 512 || kv.CachedTokens != 1024 {
		t.Fatalf("cached: round robin %d (want 512), kv %d (want 1024)", rr.CachedTokens, kv.CachedTokens)
	}
	if kv.Load.Max != 3 || rr.Load != (Spread{Min: 1, Max: 2, Mean: 1.5, CV: 1.0 / 3}) {
		t.Fatalf("load: kv %+v, rr %+v", kv.Load, rr.Load)
	}
	if kv.TTFT.Mean >= rr.TTFT.Mean {
		t.Fatalf("kv ttft %v not below round robin's %v", kv.TTFT.Mean, rr.TTFT.Mean)
	}
}

// Eviction: a 20-block pool. A (16 prompt blocks + 1 for its output) is
// done and its 16 cached blocks are free; B needs 17 blocks: 4 never used,
// then the 13 least recently used, A's tail first. C repeats A and finds
// only A's first 3 blocks. The KV index follows every event.
func TestEvictionByHand(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 10_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{5, 6}},
		{Timestamp: 20_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
	}
	cfg := small()
	cfg.Blocks = 20
	for _, name := range []string{RoundRobin, KV} {
		res := run(t, reqs, name, cfg)
		if res.CachedTokens != 3*64 || res.RejectedEvents != 0 || res.UnpublishedEvts != 0 {
			t.Fatalf("%s: %+v", name, res)
		}
	}
}

func TestTooLargeIsRejectedAndCounted(t *testing.T) {
	cfg := small()
	cfg.Blocks = 4
	res := run(t, []trace.Request{
		{InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{InputLength: 100, OutputLength: 1, HashIDs: []uint64{3}},
	}, RoundRobin, cfg)
	if res.Rejected != 1 || res.Completed != 1 || res.Requests != 2 {
		t.Fatalf("%+v", res)
	}
}

func TestDeterministic(t *testing.T) {
	sc := trace.DefaultSynth()
	sc.Requests, sc.Rate = 400, 50
	reqs, err := trace.Synthesize(sc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Workers, cfg.Blocks, cfg.Seed = 4, 2048, 7
	for _, name := range Routers {
		a, b := run(t, reqs, name, cfg), run(t, reqs, name, cfg)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs differ:\n%+v\n%+v", name, a, b)
		}
		if a.Completed != 400 || a.RejectedEvents != 0 {
			t.Fatalf("%s: %+v", name, a)
		}
	}
}

func TestConfigAndRouterErrors(t *testing.T) {
	bad := small()
	bad.Speedup = 0
	if _, err := Run(nil, KV, bad); err == nil {
		t.Error("speedup 0 accepted")
	}
	if _, err := Run(nil, "best", small()); err == nil {
		t.Error("unknown router accepted")
	}
	if _, err := ParseRouters("kv,nope"); err == nil {
		t.Error("ParseRouters accepted nope")
	}
	if _, err := ParseRouters("kv,random, kv"); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("ParseRouters of kv twice: %v", err)
	}
	if got, err := ParseRouters("kv, random"); err != nil || !reflect.DeepEqual(got, []string{KV, Random}) {
		t.Errorf("ParseRouters: %v %v", got, err)
	}
}

func TestSummarise(t *testing.T) {
	d := Summarise([]float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10})
	if d != (Dist{Mean: 5.5, P50: 5, P90: 9, P99: 10}) {
		t.Fatalf("%+v", d)
	}
	if Summarise(nil) != (Dist{}) {
		t.Fatal("empty")
	}
}

// The workload of two requests sharing a trace block on one worker: A's
// match, A's blocks stored as its prefill completes, B's match, B's new
// blocks stored under A's first 8.
func TestWorkload(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 10_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 3}},
	}
	ops, err := Workload(reqs, small())
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 4 {
		t.Fatalf("%d ops: %+v", len(ops), ops)
	}
	if ops[0].Match == nil || len(ops[0].Match) != 16 || ops[0].T != 0 || ops[0].Blocks() != 16 {
		t.Fatalf("op 0 %+v", ops[0])
	}
	st, ok := ops[1].Event.Data.(kvevent.Stored)
	if !ok || len(st.Blocks) != 16 || st.HasParent || ops[1].T != PrefillMs(1024)+DecodeMs(1024.0/6400) {
		t.Fatalf("op 1 %+v", ops[1])
	}
	if ops[2].Match == nil || ops[2].T != 10_000 {
		t.Fatalf("op 2 %+v", ops[2])
	}
	st2, ok := ops[3].Event.Data.(kvevent.Stored)
	if !ok || len(st2.Blocks) != 8 || !st2.HasParent || st2.ParentHash != st.Blocks[7].BlockHash || ops[3].Blocks() != 8 {
		t.Fatalf("op 3 %+v", ops[3])
	}
	for i := 1; i < len(ops); i++ {
		if ops[i].T < ops[i-1].T {
			t.Fatal("ops out of time order")
		}
	}
}

// TestBlockMap drives an engine's block map and a Go map with the same
// random puts and deletions over a small hash space (long clusters, wrap
// around, growth past its sizing) and compares them after every op.
func TestBlockMap(t *testing.T) {
	for seed := range uint64(10) {
		r := rand.New(rand.NewPCG(seed, 1))
		m, want := newBlockMap(4+r.IntN(20)), map[uint64]*cblock{}
		for step := range 3000 {
			h := uint64(r.IntN(200)) << (r.IntN(2) * 40)
			if b := want[h]; b != nil && r.IntN(2) == 0 {
				m.del(h)
				delete(want, h)
			} else if b == nil {
				b = &cblock{hash: h}
				m.put(b)
				want[h] = b
			}
			for k := uint64(0); k < 200; k++ {
				for _, hk := range []uint64{k, k << 40} {
					if got := m.get(hk); got != want[hk] {
						t.Fatalf("seed %d step %d: get(%#x) = %p, want %p", seed, step, hk, got, want[hk])
					}
				}
			}
			if m.n != len(want) {
				t.Fatalf("seed %d step %d: %d entries, want %d", seed, step, m.n, len(want))
			}
		}
	}
}

// A request whose output length is 2^63-1 tokens is too large for any
// engine and is counted as rejected (its size used to overflow into a
// small one), beside a request that runs.
func TestHugeOutputIsRejected(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 100, OutputLength: math.MaxInt64, HashIDs: []uint64{1}},
		{Timestamp: 1, InputLength: 100, OutputLength: 4, HashIDs: []uint64{2}},
	}
	res, err := Run(reqs, KV, DefaultConfig())
	if err != nil || res.Rejected != 1 || res.Completed != 1 {
		t.Fatalf("rejected %d, completed %d (%v), want 1 and 1", res.Rejected, res.Completed, err)
	}
	if _, _, err := References(reqs, DefaultConfig()); err != nil {
		t.Fatal(err)
	}
}

// The host tier by hand: a 20-block pool with a 20-block host tier. B's
// admission evicts A's 13 tail blocks, which go to the host; C repeats A,
// finds A's first 3 blocks on the device and loads the next 12 back from
// the host (the last prompt token is always computed), at a transfer's
// cost instead of a prefill's. The indexes follow every event, of both
// tiers.
func TestOffloadByHand(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 10_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{5, 6}},
		{Timestamp: 20_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
	}
	cfg := small()
	cfg.Blocks = 20
	plain := run(t, reqs, KV, cfg)
	cfg.Offload = 1
	for _, name := range []string{RoundRobin, KV, KVTiers} {
		res := run(t, reqs, name, cfg)
		if res.CachedTokens != 3*64 || res.LoadedTokens != 12*64 || res.RejectedEvents != 0 || res.UnpublishedEvts != 0 {
			t.Fatalf("%s: %+v", name, res)
		}
		near(t, name+" reuse from the host", res.ReuseByTier.HostPinned, float64(12*64)/float64(3*1024))
		near(t, name+" reuse", res.ReuseRatio, float64(15*64)/float64(3*1024))
		if res.TTFT.Mean >= plain.TTFT.Mean {
			t.Fatalf("%s: mean TTFT %v ms, not below %v without the host tier", name, res.TTFT.Mean, plain.TTFT.Mean)
		}
	}
}

// kv_tiers weighing every tier but the device at 0 decides exactly as kv;
// with the host tier it keeps the index exact (no event refused) and
// routes to blocks held on the host.
func TestKVTiers(t *testing.T) {
	sc := trace.DefaultSynth()
	sc.Requests, sc.Rate = 400, 50
	reqs, err := trace.Synthesize(sc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Workers, cfg.Blocks, cfg.Seed, cfg.Offload = 4, 256, 7, 2
	kv := run(t, reqs, KV, cfg)
	cfg.TierWeights = [kvevent.NumTiers]float64{1, 0, 0, 0}
	blind := run(t, reqs, KVTiers, cfg)
	blind.Router = KV
	if !reflect.DeepEqual(kv, blind) {
		t.Fatalf("kv_tiers with the host at 0 differs from kv:\n%+v\n%+v", blind, kv)
	}
	cfg.TierWeights = [kvevent.NumTiers]float64{}
	tiers := run(t, reqs, KVTiers, cfg)
	if tiers.RejectedEvents != 0 || tiers.UnpublishedEvts != 0 || tiers.LoadedTokens <= kv.LoadedTokens || tiers.Completed != 400 {
		t.Fatalf("kv_tiers: %+v\nkv: %+v", tiers, kv)
	}
}
