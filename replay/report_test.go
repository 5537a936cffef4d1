package replay

import (
	"context"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kvradix/kvradix/trace"
)

// References by hand: a 20-block fleet. A (16 prompt blocks) then C (16
// other blocks) fill it; LRU evicts 12 blocks, A's tail first, so A again
// finds its first 4 blocks pooled, and 15 (all but the last token's block)
// unbounded.
func TestReferencesByHand(t *testing.T) {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 20_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 10_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{5, 6}}, // arrives second
	}
	cfg := small()
	cfg.Blocks = 20
	pooled, unbounded, err := References(reqs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "pooled", pooled, 4*64/3072.0)
	near(t, "unbounded", unbounded, 15*64/3072.0)

	// A request larger than one engine is skipped, as Run rejects it.
	big := append(reqs, trace.Request{Timestamp: 30_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}})
	cfg.Blocks = 17
	p2, u2, err := References(big, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p2 >= u2 || u2 <= 0 {
		t.Fatalf("17 blocks: pooled %v, unbounded %v", p2, u2)
	}
	cfg.Blocks = 16 // every request needs 17: all skipped
	if p, u, err := References(big, cfg); err != nil || p != 0 || u != 0 {
		t.Fatalf("all too large: %v %v %v", p, u, err)
	}
	cfg.Workers = 0
	if _, _, err := References(reqs, cfg); err == nil {
		t.Fatal("invalid config accepted")
	}
}

func synthSmall(t *testing.T) []trace.Request {
	t.Helper()
	sc := trace.DefaultSynth()
	sc.Requests, sc.Rate = 400, 50
	reqs, err := trace.Synthesize(sc)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// The references bound every router: unbounded ≥ pooled (LRU is a stack
// algorithm: a larger cache holds a superset), and on this workload pooled
// ≥ every router's reuse; efficiency is reuse over pooled.
func TestCompareEfficiency(t *testing.T) {
	reqs := synthSmall(t)
	cfg := DefaultConfig()
	cfg.Workers, cfg.Blocks = 4, 1024
	rep, err := Compare(context.Background(), reqs, Routers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !(rep.ReuseUnbounded >= rep.ReusePooled && rep.ReusePooled > 0) {
		t.Fatalf("references: pooled %v, unbounded %v", rep.ReusePooled, rep.ReuseUnbounded)
	}
	for i, res := range rep.Results {
		if res.Router != Routers[i] {
			t.Fatalf("result %d is %s, want %s", i, res.Router, Routers[i])
		}
		near(t, res.Router+" efficiency", res.RoutingEfficiency, res.ReuseRatio/rep.ReusePooled)
		if res.ReuseRatio > rep.ReusePooled {
			t.Errorf("%s reuses %v, above the pooled cache's %v", res.Router, res.ReuseRatio, rep.ReusePooled)
		}
		if len(res.TTFTPercentiles) != 101 || res.TTFTPercentiles[50] != res.TTFT.P50 || res.TTFTPercentiles[99] != res.TTFT.P99 {
			t.Errorf("%s: percentiles %v vs %+v", res.Router, res.TTFTPercentiles, res.TTFT)
		}
	}
	if rep.Workers != 4 || rep.Blocks != 1024 || rep.BlockSize != cfg.BlockSize {
		t.Fatalf("report header %+v", rep)
	}
}

func TestParseSetting(t *testing.T) {
	got, err := ParseSetting("overlap_weight=0, 0.5,4")
	if err != nil || !reflect.DeepEqual(got, Setting{Name: SetOverlapWeight, Values: []float64{0, 0.5, 4}}) {
		t.Fatalf("%+v %v", got, err)
	}
	for in, want := range map[string]string{
		"overlap_weight":      "name=v1,v2",
		"overlap_weight=":     "name=v1,v2",
		"weight=1":            "unknown setting",
		"temperature=-1":      "finite number",
		"queue_threshold=NaN": "finite number",
		"temperature=Inf":     "finite number",
		"overlap_weight=1,x":  "finite number",
	} {
		if _, err := ParseSetting(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

// A sweep is the grid of its settings, first setting slowest; each point is
// the plain replay under that configuration.
func TestSweepGrid(t *testing.T) {
	reqs := synthSmall(t)
	cfg := DefaultConfig()
	cfg.Workers, cfg.Blocks = 4, 1024
	rep, err := Sweep(context.Background(), reqs, []Setting{{SetOverlapWeight, []float64{1, 8}}, {SetTemperature, []float64{0, 0.5}}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wantSettings := []map[string]float64{
		{SetOverlapWeight: 1, SetTemperature: 0}, {SetOverlapWeight: 1, SetTemperature: 0.5},
		{SetOverlapWeight: 8, SetTemperature: 0}, {SetOverlapWeight: 8, SetTemperature: 0.5},
	}
	if len(rep.Points) != len(wantSettings) || len(rep.Results) != 2 || rep.Results[0].Router != RoundRobin || rep.Results[1].Router != KV {
		t.Fatalf("%d points, baselines %d", len(rep.Points), len(rep.Results))
	}
	for i, p := range rep.Points {
		if !reflect.DeepEqual(p.Settings, wantSettings[i]) || p.Router != KVTemp {
			t.Fatalf("point %d: %v %s", i, p.Settings, p.Router)
		}
	}
	c := cfg
	c.OverlapWeight, c.Temperature = 8, 0.5
	want := run(t, reqs, KVTemp, c)
	want.setEfficiency(rep.ReusePooled)
	if !reflect.DeepEqual(rep.Points[3].Result, want) {
		t.Fatalf("point 3 differs from its plain replay:\n%+v\n%+v", rep.Points[3].Result, want)
	}
	// Without temperature the swept router is kv.
	rep, err = Sweep(context.Background(), reqs, []Setting{{SetQueueThreshold, []float64{0}}}, cfg)
	if err != nil || rep.Points[0].Router != KV {
		t.Fatalf("%v %+v", err, rep.Points)
	}
}

// The router's queue runs on the virtual clock: under a burst with a low
// threshold requests are held back, and every one still completes.
func TestQueueThreshold(t *testing.T) {
	sc := trace.DefaultSynth()
	sc.Requests, sc.Rate, sc.UserTokens = 300, 2000, 3000
	reqs, err := trace.Synthesize(sc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Workers, cfg.Blocks = 2, 4096
	open := run(t, reqs, KV, cfg)
	cfg.QueueThreshold = 0.01
	held := run(t, reqs, KV, cfg)
	if open.Queued != 0 || held.Queued == 0 {
		t.Fatalf("queued: without threshold %d (want 0), with %d (want > 0)", open.Queued, held.Queued)
	}
	if held.Completed != len(reqs) || reflect.DeepEqual(open.TTFT, held.TTFT) {
		t.Fatalf("with queueing: completed %d of %d, ttft %+v (without: %+v)", held.Completed, len(reqs), held.TTFT, open.TTFT)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.QueueThreshold = -1 },
		func(c *Config) { c.OverlapWeight = math.Inf(1) },
		func(c *Config) { c.Temperature = math.NaN() },
		// what a mistyped flag asks for, refused before anything is made
		func(c *Config) { c.Blocks = MaxBlocks + 1 },
		func(c *Config) { c.Workers = MaxTotalBlocks/c.Blocks + 1 },
		func(c *Config) { c.Workers, c.DPSize = math.MaxInt, 2 },
		func(c *Config) { c.IndexerLanes = 1 << 40 },
		func(c *Config) { c.BlockSize = MaxBlockSize + 1 },
	} {
		c := DefaultConfig()
		bad(&c)
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestPercentiles(t *testing.T) {
	xs := make([]float64, 200)
	for i := range xs {
		xs[i] = float64(200 - i) // 1..200, reversed
	}
	p := Percentiles(xs)
	if len(p) != 101 || p[0] != 1 || p[50] != 100 || p[99] != 198 || p[100] != 200 {
		t.Fatalf("%v", p)
	}
	if Percentiles(nil) != nil {
		t.Fatal("empty")
	}
}

// Ranks are engines of their own: 2 workers × 2 ranks route exactly as 4
// workers of one rank (same pair order, same seed), overlap included.
func TestDPRanksRouteAsWorkers(t *testing.T) {
	reqs := synthSmall(t)
	flat := DefaultConfig()
	flat.Workers, flat.Blocks = 4, 1024
	ranked := flat
	ranked.Workers, ranked.DPSize = 2, 2
	for _, name := range []string{KV, RoundRobin} {
		a, b := run(t, reqs, name, flat), run(t, reqs, name, ranked)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: 4 workers and 2x2 ranks differ:\n%+v\n%+v", name, a, b)
		}
		if a.CachedTokens == 0 || a.RejectedEvents != 0 {
			t.Fatalf("%s: %+v", name, a)
		}
	}
	p1, u1, _ := References(reqs, flat)
	p2, u2, _ := References(reqs, ranked)
	if p1 != p2 || u1 != u2 {
		t.Fatalf("references differ: %v %v vs %v %v", p1, u1, p2, u2)
	}
	ranked.DPSize = 0
	if ranked.Validate() == nil {
		t.Fatal("dp size 0 accepted")
	}
}

// Routers, sweep points and the references run in parallel (at most
// GOMAXPROCS at a time): the reports must equal the sequential run's to the
// last bit, and the progress callback must count every replay once.
func TestParallelEqualsSequential(t *testing.T) {
	reqs := synthSmall(t)
	cfg := DefaultConfig()
	cfg.Workers, cfg.Blocks = 4, 1024
	p := startPrompts(context.Background(), reqs, cfg)
	defer p.close()
	routers := []string{RoundRobin, Random, KV, KVTemp}
	seq, err1 := compare(context.Background(), reqs, p, routers, cfg, 1)
	par, err2 := compare(context.Background(), reqs, p, routers, cfg, 4)
	if err1 != nil || err2 != nil || !reflect.DeepEqual(seq, par) {
		t.Fatalf("compare: sequential and parallel differ (%v, %v)", err1, err2)
	}
	settings := []Setting{{SetOverlapWeight, []float64{1, 4, 8}}, {SetTemperature, []float64{0, 0.1}}}
	var calls []int
	sseq, err1 := sweep(context.Background(), reqs, p, settings, cfg, 1, nil)
	spar, err2 := sweep(context.Background(), reqs, p, settings, cfg, 4, func(done, total int) {
		if total != 1+2+6 {
			t.Errorf("progress total %d, want 9", total)
		}
		calls = append(calls, done)
	})
	if err1 != nil || err2 != nil || !reflect.DeepEqual(sseq, spar) {
		t.Fatalf("sweep: sequential and parallel differ (%v, %v)", err1, err2)
	}
	if len(calls) != 9 || calls[8] != 9 {
		t.Fatalf("progress calls %v, want 1..9", calls)
	}
	// And Compare (hashing its own prompts) equals compare over shared ones.
	if rep, err := Compare(context.Background(), reqs, routers, cfg); err != nil || !reflect.DeepEqual(rep, seq) {
		t.Fatalf("Compare differs from compare over shared prompts (%v)", err)
	}
}
