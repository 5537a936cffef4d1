package router

import (
	"context"
	"errors"
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
	// tokens, 3 unique blocks.
	// Both idle: cost 10/4 + 3 each, so either by tie-break.
	busy, err := s.Schedule(context.Background(), SchedRequest{ID: id(1), ISL: 10, Blocks: []uint64{100, 101}})
	if err != nil {
		t.Fatal(err)
	}
	idle := kvevent.Worker{ID: 1 - busy.ID}
	// A request of 8 tokens (blocks 100, 201), 1 block cached on the busy
	// worker:
	//   busy: prefill (10 + 8 - 4)/4 = 3.5, decode 3 + (2 - 1 shared) = 4 -> 7.5
	//   idle: prefill 8/4 = 2,            decode 0 + 2 = 2             -> 4
	req := SchedRequest{ID: id(2), ISL: 8, Blocks: []uint64{100, 201}, Overlaps: map[kvevent.Worker]uint32{busy: 1}}
	loads := s.PotentialLoads(req)
	want := map[kvevent.Worker]PotentialLoad{
		busy: {Worker: busy, PrefillTokens: 14, DecodeBlocks: 4, ActiveRequests: 1},
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
	// cached block wins: busy (8-4)/4*10 + 4 = 14 vs idle (8+8)/4*10 + (3+2) = 45.
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
	if l := s.PotentialLoads(SchedRequest{ISL: 13, Blocks: []uint64{1, 2, 9}})[0]; l.DecodeBlocks != 3+2 {
		t.Fatalf("a request with 1 new block and a partial one: %+v", l)
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
