package router

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/kvevent"
)

func workers(n int) []kvevent.Worker {
	ws := make([]kvevent.Worker, n)
	for i := range ws {
		ws[i] = kvevent.Worker{ID: kvevent.WorkerID(i)}
	}
	return ws
}

func newSched(t *testing.T, cfg SchedulerConfig, n int) *Scheduler {
	t.Helper()
	s, err := NewScheduler(cfg, workers(n))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func baseCfg() SchedulerConfig {
	return SchedulerConfig{BlockSize: 4, OverlapWeight: 1, TrackPrefillTokens: true, MaxBatchedTokens: 8192}
}

func id(i int) uuid.UUID { return uuid.NewSHA1(uuid.Nil, []byte{byte(i), byte(i >> 8)}) }

func TestCostByHand(t *testing.T) {
	s := newSched(t, baseCfg(), 2)
	// Worker 1 runs a 10-token request (2 full blocks + partial): 10 prefill
	// tokens, 2 active blocks (the partial block counts nowhere).
	// Both idle: cost 10/4 + 2 each, so either by tie-break.
	busy, err := s.Schedule(context.Background(), SchedRequest{ID: id(1), ISL: 10, Blocks: []uint64{100, 101}})
	if err != nil {
		t.Fatal(err)
	}
	idle := kvevent.Worker{ID: 1 - busy.ID}
	// A request of 8 tokens (blocks 100, 201), 1 block cached on the busy
	// worker:
	//   busy: prefill (10 + 8 - 4)/4 = 3.5, decode 2 + (2 - 1 shared) = 3 -> 6.5
	//   idle: prefill 8/4 = 2,            decode 0 + 2 = 2             -> 4
	req := SchedRequest{ID: id(2), ISL: 8, Blocks: []uint64{100, 201}, Overlaps: map[kvevent.Worker]uint32{busy: 1}}
	loads := s.PotentialLoads(req)
	want := map[kvevent.Worker]PotentialLoad{
		busy: {Worker: busy, PrefillTokens: 14, DecodeBlocks: 3, ActiveRequests: 1},
		idle: {Worker: idle, PrefillTokens: 8, DecodeBlocks: 2, ActiveRequests: 0},
	}
	for _, l := range loads {
		if l != want[l.Worker] {
			t.Errorf("load %+v, want %+v", l, want[l.Worker])
		}
	}
	got, err := s.Schedule(context.Background(), req)
	if err != nil || got != idle {
		t.Fatalf("scheduled on %v (%v), want the idle worker %v", got, err, idle)
	}
	// With prefill done on the busy worker and overlap weight 10, the
	// cached block wins: busy (8-4)/4*10 + 3 = 13 vs idle (8+8)/4*10 + (2+2) = 44.
	s.cfg.OverlapWeight = 10
	if err := s.MarkPrefillCompleted(id(1)); err != nil {
		t.Fatal(err)
	}
	req3 := SchedRequest{ID: id(3), ISL: 8, Blocks: []uint64{100, 301}, Overlaps: map[kvevent.Worker]uint32{busy: 1}}
	if got, _ := s.Schedule(context.Background(), req3); got != busy {
		t.Fatalf("scheduled on %v, want %v", got, busy)
	}
}

func TestSharedBlocksCountOnce(t *testing.T) {
	s := newSched(t, baseCfg(), 1)
	blocks := []uint64{1, 2, 3}
	for i := range 2 {
		if _, err := s.Schedule(context.Background(), SchedRequest{ID: id(i), ISL: 12, Blocks: blocks}); err != nil {
			t.Fatal(err)
		}
	}
	load := func() PotentialLoad { return s.PotentialLoads(SchedRequest{ISL: 0})[0] }
	if l := load(); l.DecodeBlocks != 3 || l.ActiveRequests != 2 || l.PrefillTokens != 24 {
		t.Fatalf("two requests sharing 3 blocks: %+v", l)
	}
	if l := s.PotentialLoads(SchedRequest{ISL: 13, Blocks: []uint64{1, 2, 9}})[0]; l.DecodeBlocks != 3+1 {
		t.Fatalf("a request with 1 new block and a partial one (not counted): %+v", l)
	}
	if err := s.Free(id(0)); err != nil {
		t.Fatal(err)
	}
	if l := load(); l.DecodeBlocks != 3 || l.ActiveRequests != 1 || l.PrefillTokens != 12 {
		t.Fatalf("after one free: %+v", l)
	}
	if err := s.Free(id(1)); err != nil {
		t.Fatal(err)
	}
	if l := load(); l != (PotentialLoad{Worker: kvevent.Worker{}}) || len(s.refs) != 0 || s.Active() != 0 {
		t.Fatalf("after both free: %+v, %d refs", l, len(s.refs))
	}
}

// SetWorkers keeps the load and requests of the workers still listed (in
// their new places), starts new ones idle and forgets the requests of the
// workers gone: the scheduler then weighs exactly as one built over the new
// workers with only the kept requests admitted.
func TestSetWorkers(t *testing.T) {
	w := func(i int) kvevent.Worker { return kvevent.Worker{ID: kvevent.WorkerID(i)} }
	type placed struct {
		req SchedRequest
		on  kvevent.Worker
	}
	reqs := []placed{
		{SchedRequest{ID: id(1), ISL: 12, Blocks: []uint64{7, 8, 9}}, w(0)},
		{SchedRequest{ID: id(2), ISL: 9, Blocks: []uint64{7, 8}}, w(1)},
		{SchedRequest{ID: id(3), ISL: 8, Blocks: []uint64{7, 5}}, w(2)},
		{SchedRequest{ID: id(4), ISL: 4, Blocks: []uint64{9}}, w(0)},
	}
	s := newSched(t, baseCfg(), 3)
	for _, p := range reqs {
		if err := s.Admit(p.req, p.on); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MarkPrefillCompleted(id(4)); err != nil {
		t.Fatal(err)
	}
	after := []kvevent.Worker{w(2), w(3), w(0)}
	dropped, err := s.SetWorkers(nil, after)
	if err != nil || len(dropped) != 1 || dropped[0] != id(2) {
		t.Fatalf("dropped %v, %v; want request 2 (on worker 1)", dropped, err)
	}
	want, err := NewScheduler(baseCfg(), after)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range reqs {
		if p.on != w(1) {
			if err := want.Admit(p.req, p.on); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := want.MarkPrefillCompleted(id(4)); err != nil {
		t.Fatal(err)
	}
	probe := SchedRequest{ID: id(9), ISL: 16, Blocks: []uint64{7, 8, 9, 5}, Overlaps: map[kvevent.Worker]uint32{w(0): 2, w(3): 1}}
	if got, exp := s.PotentialLoads(probe), want.PotentialLoads(probe); !slices.Equal(got, exp) {
		t.Fatalf("loads after SetWorkers %+v, want %+v", got, exp)
	}
	if err := s.Free(id(2)); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("free of a dropped request: %v", err)
	}
	for _, i := range []int{1, 3, 4} {
		if err := s.Free(id(i)); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.refs) != 0 || s.Active() != 0 || s.unique[2] != 0 || s.prefill[0] != 0 {
		t.Fatalf("after every free: %d refs, %d active, unique %v, prefill %v", len(s.refs), s.Active(), s.unique, s.prefill)
	}
	if _, err := s.SetWorkers(nil, []kvevent.Worker{w(1), w(1)}); err == nil {
		t.Fatal("a worker listed twice: no error")
	}
	if _, err := s.SetWorkers(nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Schedule(context.Background(), probe); !errors.Is(err, errNoWorkers) {
		t.Fatalf("schedule on no workers: %v", err)
	}
	if _, err := s.SetWorkers(nil, after[:1]); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Schedule(context.Background(), probe); err != nil || got != w(2) {
		t.Fatalf("schedule after workers came back: %v, %v", got, err)
	}
}

// A request waiting in the queue when every worker leaves fails at once,
// not at its deadline.
func TestSetWorkersWakesTheQueue(t *testing.T) {
	cfg := baseCfg()
	cfg.QueueThreshold, cfg.MaxBatchedTokens = 1, 4
	s := newSched(t, cfg, 1)
	if _, err := s.Schedule(context.Background(), SchedRequest{ID: id(1), ISL: 100, Blocks: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.Schedule(ctx, SchedRequest{ID: id(2), ISL: 4, Blocks: []uint64{2}})
		done <- err
	}()
	waitQueued(t, s, 1)
	if _, err := s.SetWorkers(nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, errNoWorkers) {
		t.Fatalf("queued request: %v, want errNoWorkers", err)
	}
}

func TestUnknownAndDuplicateIDs(t *testing.T) {
	s := newSched(t, baseCfg(), 2)
	if err := s.Free(id(9)); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("free: %v", err)
	}
	if err := s.MarkPrefillCompleted(id(9)); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("prefill: %v", err)
	}
	if _, err := s.Schedule(context.Background(), SchedRequest{ID: id(1), ISL: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Schedule(context.Background(), SchedRequest{ID: id(1), ISL: 4}); !errors.Is(err, ErrDuplicateRequest) {
		t.Fatalf("duplicate: %v", err)
	}
}

func TestTieBreakIsUniform(t *testing.T) {
	s := newSched(t, baseCfg(), 4)
	counts := map[kvevent.Worker]int{}
	for i := range 4000 {
		w, err := s.Schedule(context.Background(), SchedRequest{ID: id(i), ISL: 8})
		if err != nil {
			t.Fatal(err)
		}
		counts[w]++
		if err := s.Free(id(i)); err != nil {
			t.Fatal(err)
		}
	}
	for w, c := range counts {
		if c < 850 || c > 1150 {
			t.Errorf("worker %v chosen %d of 4000 times", w, c)
		}
	}
	if len(counts) != 4 {
		t.Errorf("counts %v", counts)
	}
}

func TestSeedMakesDecisionsRepeatable(t *testing.T) {
	run := func(seed uint64) []kvevent.Worker {
		cfg := baseCfg()
		cfg.Seed, cfg.Temperature = seed, 0.5
		s := newSched(t, cfg, 8)
		var out []kvevent.Worker
		for i := range 50 {
			w, _ := s.Schedule(context.Background(), SchedRequest{ID: id(i), ISL: 8 + i})
			out = append(out, w)
		}
		return out
	}
	a, b := run(1), run(1)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 1 differs at %d", i)
		}
	}
}

func TestTemperatureSamples(t *testing.T) {
	cfg := baseCfg()
	cfg.Temperature = 0.3
	s := newSched(t, cfg, 2)
	// Worker 0 caches the whole prompt: cost 0/4 + 4 = 4 vs 16/4 + 4 = 8,
	// normalised 0 and 1: p(0) = 1/(1+e^(-1/0.3)) ≈ 0.966.
	ov := map[kvevent.Worker]uint32{{ID: 0}: 4}
	counts := [2]int{}
	for i := range 2000 {
		w, _ := s.Schedule(context.Background(), SchedRequest{ID: id(i), ISL: 16, Blocks: []uint64{1, 2, 3, 4}, Overlaps: ov})
		counts[w.ID]++
		_ = s.Free(id(i))
	}
	if counts[0] < 1870 || counts[0] > 1990 {
		t.Fatalf("worker 0 chosen %d of 2000, want about 1932", counts[0])
	}
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]SchedulerConfig{
		"block size":  {BlockSize: 0},
		"weight":      {BlockSize: 4, OverlapWeight: -1},
		"temperature": {BlockSize: 4, Temperature: -0.1},
		"queue":       {BlockSize: 4, QueueThreshold: 1},
	} {
		if _, err := NewScheduler(cfg, workers(1)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewScheduler(baseCfg(), nil); err == nil {
		t.Error("no workers accepted")
	}
	if _, err := NewScheduler(baseCfg(), []kvevent.Worker{{ID: 1}, {ID: 1}}); err == nil {
		t.Error("duplicate workers accepted")
	}
}

func TestQueueing(t *testing.T) {
	cfg := baseCfg()
	cfg.QueueThreshold, cfg.MaxBatchedTokens = 1, 8 // busy above 8 prefill tokens
	s := newSched(t, cfg, 1)
	ctx := context.Background()
	if _, err := s.Schedule(ctx, SchedRequest{ID: id(1), ISL: 16}); err != nil {
		t.Fatal(err)
	}
	// The only worker is busy: the next requests wait, in order.
	order := make(chan int, 2)
	for i := 2; i <= 3; i++ {
		go func() {
			if _, err := s.Schedule(ctx, SchedRequest{ID: id(i), ISL: 16}); err != nil {
				t.Error(err)
			}
			order <- i
		}()
		waitQueued(t, s, i-1) // request i queues before the next
	}
	// A request whose context ends while waiting gets its error.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := s.Schedule(cctx, SchedRequest{ID: id(4), ISL: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	select {
	case i := <-order:
		t.Fatalf("request %d ran while the worker was busy", i)
	default:
	}
	if err := s.MarkPrefillCompleted(id(1)); err != nil {
		t.Fatal(err)
	}
	if first := <-order; first != 2 {
		t.Fatalf("request %d went first, want 2", first)
	}
	// Request 2 made the worker busy again; 3 waits for its prefill.
	select {
	case <-order:
		t.Fatal("request 3 ran while the worker was busy")
	case <-time.After(20 * time.Millisecond):
	}
	if err := s.Free(id(2)); err != nil {
		t.Fatal(err)
	}
	if next := <-order; next != 3 {
		t.Fatalf("got %d", next)
	}
	// Close releases waiters with ErrShutdown.
	done := make(chan error)
	go func() {
		_, err := s.Schedule(ctx, SchedRequest{ID: id(5), ISL: 1})
		done <- err
	}()
	waitQueued(t, s, 1)
	s.Close()
	if err := <-done; !errors.Is(err, ErrShutdown) {
		t.Fatalf("waiter after close: %v", err)
	}
}

// waitQueued waits until n requests wait in s's queue.
func waitQueued(t *testing.T, s *Scheduler, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		s.mu.Lock()
		q := len(s.waiters)
		s.mu.Unlock()
		if q == n {
			return
		}
	}
	t.Fatalf("%d requests never queued", n)
}

// A duplicate id is refused before it can queue: neither a copy of an
// active request nor a copy of a waiting one waits, so none is admitted as
// new once the original is freed.
func TestDuplicateRefusedBeforeQueueing(t *testing.T) {
	cfg := baseCfg()
	cfg.QueueThreshold, cfg.MaxBatchedTokens = 1, 8
	s := newSched(t, cfg, 1)
	ctx := context.Background()
	if _, err := s.Schedule(ctx, SchedRequest{ID: id(1), ISL: 16}); err != nil {
		t.Fatal(err)
	}
	// Busy: a copy of the active request is refused at once, not queued.
	if _, err := s.Schedule(ctx, SchedRequest{ID: id(1), ISL: 16}); !errors.Is(err, ErrDuplicateRequest) {
		t.Fatalf("copy of an active request: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Schedule(ctx, SchedRequest{ID: id(2), ISL: 16})
		done <- err
	}()
	waitQueued(t, s, 1)
	if _, err := s.Schedule(ctx, SchedRequest{ID: id(2), ISL: 4}); !errors.Is(err, ErrDuplicateRequest) {
		t.Fatalf("copy of a waiting request: %v", err)
	}
	if err := s.Free(id(1)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.Active() != 1 || len(s.waiting) != 0 {
		t.Fatalf("active %d, waiting ids %d", s.Active(), len(s.waiting))
	}
	s.Close()
}

// dynamoCost is a hand-written reference of the reference router's cost for
// worker w: its tracked sequences count complete blocks only.
//
//	logit = weight · (active prefill tokens + isl − overlap·bs) / bs
//	      + (active blocks + the request's complete blocks not active there)
type dynamoRef struct {
	bs      int
	weight  float64
	prefill []int
	active  []map[uint64]int // block → requests holding it
}

func (d *dynamoRef) cost(w int, isl int, blocks []uint64, overlap uint32) float64 {
	newBlocks := 0
	for _, h := range blocks {
		if d.active[w][h] == 0 {
			newBlocks++
		}
	}
	pre := float64(d.prefill[w]+isl-int(overlap)*d.bs) / float64(d.bs)
	return d.weight*pre + float64(len(d.active[w])+newBlocks)
}

// On random prompt lengths (most ending mid-block), random shared prefixes
// and overlaps, every decision is one of the reference's cheapest workers.
func TestCostMatchesDynamoReference(t *testing.T) {
	const n, bs, requests = 5, 16, 300
	cfg := baseCfg()
	cfg.BlockSize = bs
	s := newSched(t, cfg, n)
	ref := &dynamoRef{bs: bs, weight: cfg.OverlapWeight, prefill: make([]int, n), active: make([]map[uint64]int, n)}
	for w := range ref.active {
		ref.active[w] = map[uint64]int{}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	type live struct {
		id      uuid.UUID
		w       int
		prefill int
		blocks  []uint64
	}
	var running []live
	for i := range requests {
		isl := 1 + rng.IntN(200)
		full := isl / bs
		prefix := uint64(rng.IntN(4)) // one of four shared chains
		blocks := make([]uint64, full)
		for j := range blocks {
			if j < 3 {
				blocks[j] = prefix<<32 | uint64(j)
			} else {
				blocks[j] = uint64(i+1)<<40 | uint64(j)
			}
		}
		overlaps := map[kvevent.Worker]uint32{}
		for w := range n {
			if rng.IntN(2) == 0 && full > 0 {
				overlaps[kvevent.Worker{ID: kvevent.WorkerID(w)}] = uint32(rng.IntN(full + 1))
			}
		}
		req := SchedRequest{ID: id(1000 + i), ISL: isl, Blocks: blocks, Overlaps: overlaps}
		best := math.Inf(1)
		costs := make([]float64, n)
		for w := range n {
			costs[w] = ref.cost(w, isl, blocks, overlaps[kvevent.Worker{ID: kvevent.WorkerID(w)}])
			best = min(best, costs[w])
		}
		got, err := s.Schedule(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		w := int(got.ID)
		if costs[w] > best+1e-9 {
			t.Fatalf("request %d (isl %d): chose worker %d at cost %v; the reference's cheapest cost %v (all %v)", i, isl, w, costs[w], best, costs)
		}
		l := live{id: req.ID, w: w, prefill: isl - int(overlaps[got])*bs, blocks: blocks}
		ref.prefill[w] += l.prefill
		for _, h := range blocks {
			ref.active[w][h]++
		}
		running = append(running, l)
		// Prefills complete and requests finish at random.
		for k := 0; k < len(running); k++ {
			r := &running[k]
			if r.prefill > 0 && rng.IntN(3) == 0 {
				ref.prefill[r.w] -= r.prefill
				r.prefill = 0
				if err := s.MarkPrefillCompleted(r.id); err != nil {
					t.Fatal(err)
				}
			}
			if rng.IntN(6) == 0 {
				ref.prefill[r.w] -= r.prefill
				for _, h := range r.blocks {
					if ref.active[r.w][h]--; ref.active[r.w][h] == 0 {
						delete(ref.active[r.w], h)
					}
				}
				if err := s.Free(r.id); err != nil {
					t.Fatal(err)
				}
				running = append(running[:k], running[k+1:]...)
				k--
			}
		}
	}
}

// With TierOverlaps, the prefill a worker saves is weighed by tier: 10
// blocks on the host (0.8 each: 8 saved) beat 6 on the device, and lose
// to 6 on the device with weights that make the host worth half; a worker
// holding blocks off the device only is counted although it has no
// device overlap.
func TestTierWeights(t *testing.T) {
	dev, host := kvevent.Worker{ID: 0}, kvevent.Worker{ID: 1}
	req := func(i int) SchedRequest {
		return SchedRequest{ID: id(i), ISL: 40, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
			Overlaps:     map[kvevent.Worker]uint32{dev: 6},
			TierOverlaps: map[kvevent.Worker][kvevent.NumTiers]uint32{dev: {6, 6, 6, 6}, host: {0, 10, 10, 10}}}
	}
	cfg := baseCfg()
	cfg.OverlapWeight = 8
	s := newSched(t, cfg, 2)
	loads := s.PotentialLoads(req(1))
	if loads[0].PrefillTokens != 40-24 || loads[1].PrefillTokens != 40-32 {
		t.Fatalf("prefill tokens %d and %d, want 16 and 8", loads[0].PrefillTokens, loads[1].PrefillTokens)
	}
	if got, err := s.Schedule(context.Background(), req(1)); err != nil || got != host {
		t.Fatalf("scheduled on %v (%v), want the host-holding worker", got, err)
	}
	cfg.TierWeights = [kvevent.NumTiers]float64{1, 0.5, 0.25, 0}
	s = newSched(t, cfg, 2)
	if got, err := s.Schedule(context.Background(), req(2)); err != nil || got != dev {
		t.Fatalf("scheduled on %v (%v) with host weight 0.5, want the device-holding worker", got, err)
	}
	cfg.TierWeights[2] = math.Inf(1)
	if _, err := NewScheduler(cfg, workers(2)); err == nil {
		t.Fatal("an infinite tier weight was taken")
	}
}
