package vllm

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/internal/leaks"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
	"github.com/kvradix/kvradix/radix/radixtest"
	"github.com/kvradix/kvradix/shardpool"
)

// The libraries' leftover goroutines are ignored (leaks.Ignore). A closed
// socket's reader blocked delivering messages nobody reads is not: those
// held batches (closeReceiver frees them).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaks.Ignore()...)
}

const bs = 16

type engineUnderTest struct {
	pub    *Publisher
	gen    *SynthEngine
	worker kvevent.WorkerID
	conv   *Converter // builds the expected index directly
}

func newEngine(t *testing.T, worker kvevent.WorkerID, cfg PublisherConfig) *engineUnderTest {
	t.Helper()
	cfg.Endpoint = "tcp://127.0.0.1:0"
	if cfg.ReplayEndpoint == "x" {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &engineUnderTest{pub: p, gen: NewSynthEngine(uint64(worker), bs, 4, 0.3), worker: worker, conv: NewConverter(worker, bs)}
}

func (e *engineUnderTest) endpoint() Endpoint {
	return Endpoint{Worker: e.worker, Address: e.pub.Addr(), Replay: e.pub.ReplayAddr(), Topic: e.pub.cfg.Topic}
}

// publish sends n batches of 1-3 events, applying them to want as well.
func (e *engineUnderTest) publish(t *testing.T, n int, want radix.Index) {
	t.Helper()
	for i := range n {
		var evs []Event
		for range 1 + i%3 {
			evs = append(evs, e.gen.Step())
		}
		for _, ev := range e.conv.Convert(nil, &Batch{DPRank: e.pub.cfg.DPRank, Events: evs}) {
			_ = want.Apply(ev)
		}
		if _, err := e.pub.Publish(evs); err != nil {
			t.Fatal(err)
		}
	}
}

// connect publishes empty batches until the subscriber has one from each
// engine, so the slow-joiner start of PUB/SUB does not blur the test.
func connect(t *testing.T, sub *Subscriber, engines ...*engineUnderTest) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, e := range engines {
		i := endpointOf(t, sub, e)
		for sub.Received()[i] == 0 {
			if time.Now().After(deadline) {
				t.Fatal("subscriber never connected")
			}
			if _, err := e.pub.Publish(nil); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// endpointOf returns the index of e's endpoint in sub.Received: the
// subscriber's order, not the order engines are passed to a helper in
// (settle(b) once compared engine a's count with b's sequence, and waited
// forever whenever the two engines' connects took different numbers of
// batches).
func endpointOf(t *testing.T, sub *Subscriber, e *engineUnderTest) int {
	t.Helper()
	for i, ep := range sub.eps {
		if ep.cfg.Worker == e.worker {
			return i
		}
	}
	t.Fatalf("engine %d is not an endpoint of the subscriber", e.worker)
	return -1
}

// settle waits until the subscriber applied every engine's latest batch.
func settle(t *testing.T, sub *Subscriber, engines ...*engineUnderTest) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		done := true
		got := sub.Received()
		for _, e := range engines {
			e.pub.mu.Lock()
			want := e.pub.seq
			e.pub.mu.Unlock()
			done = done && got[endpointOf(t, sub, e)] == want
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscriber stuck at %v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
}

func sameIndex(t *testing.T, got, want radix.Index) {
	t.Helper()
	a, err := radixtest.FromDump(got)
	if err != nil {
		t.Fatal(err)
	}
	b, err := radixtest.FromDump(want)
	if err != nil {
		t.Fatal(err)
	}
	if d := a.Diff(b); d != "" {
		t.Fatalf("the subscriber's index differs from the engines' events: %s", d)
	}
	if got.Size() != want.Size() || got.Size() == 0 {
		t.Fatalf("sizes %d and %d", got.Size(), want.Size())
	}
}

// Messages dropped on the wire are repaired from the replay ring (both
// framings, both encodings), and a restarted engine is cleared and
// resynced: the final index equals the one built from every event.
func TestEndToEndRepairAndRestart(t *testing.T) {
	rank := 1
	a := newEngine(t, 1, PublisherConfig{ReplayEndpoint: "x", Topic: "kv@a@m", Encoding: ArrayEncoding, Framing: FramingLegacy})
	b := newEngine(t, 2, PublisherConfig{ReplayEndpoint: "x", Topic: "", Encoding: MapEncoding, Framing: FramingTopic, DPRank: &rank})
	pool := shardpool.NewPool(2, bs)
	defer pool.Close()
	sub, err := NewSubscriber(pool, SubscriberConfig{BlockSize: bs}, a.endpoint(), b.endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	connect(t, sub, a, b)

	want := radix.NewTree()
	a.pub.DropLive = func(seq uint64) bool { return seq%10 == 3 || seq%10 == 4 }
	b.pub.DropLive = func(seq uint64) bool { return seq%17 == 5 }
	a.publish(t, 60, want)
	b.publish(t, 59, want)
	b.pub.DropLive = nil
	b.publish(t, 1, want)
	// Once the subscriber caught up (else the restart would empty the ring
	// before the last gaps are replayed: a real loss), b restarts: its
	// cache is gone, its sequence starts again at 0.
	settle(t, sub, b)
	b.pub.DropLive = func(seq uint64) bool { return seq%17 == 5 }
	b.pub.Restart()
	b.gen.Restart()
	_ = want.Apply(kvevent.RouterEvent{WorkerID: 2, Event: kvevent.Event{DPRank: 1, Data: kvevent.Cleared{}}})
	b.publish(t, 30, want)
	// The last batches go through: a gap shows only when a later batch
	// arrives.
	a.pub.DropLive, b.pub.DropLive = nil, nil
	a.publish(t, 1, want)
	b.publish(t, 1, want)
	settle(t, sub, a, b)

	sameIndex(t, pool.Index(), want)
	st := sub.Stats()
	if st.GapsFound == 0 || st.GapsRepaired != st.GapsFound || st.GapsLost != 0 || st.BatchesLost != 0 || st.Restarts != 1 || st.Replayed == 0 {
		t.Fatalf("stats %+v", st)
	}
	if st.Convert.Rejected() != 0 || st.DecodeErrors != 0 || st.BadFrames != 0 || pool.Stats().Rejected() != 0 {
		t.Fatalf("stats %+v, index %+v", st, pool.Stats())
	}
}

// A gap older than the replay ring, or with no replay socket at all, is
// lost: counted and reported with its sequence numbers.
func TestUnrepairableGapsAreReported(t *testing.T) {
	short := newEngine(t, 1, PublisherConfig{ReplayEndpoint: "x", BufferSteps: 2})
	none := newEngine(t, 2, PublisherConfig{})
	pool := shardpool.NewPool(1, bs)
	defer pool.Close()
	var heard []Loss
	lossCh := make(chan Loss, 16)
	sub, err := NewSubscriber(pool, SubscriberConfig{BlockSize: bs, OnLoss: func(l Loss) { lossCh <- l }}, short.endpoint(), none.endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	connect(t, sub, short, none)
	// Under load the SUB socket joins late and connect's first batches are
	// gaps of their own (lost for the engine without a replay socket):
	// count only what the dropped batches below cause.
	base := sub.Stats()
	for len(lossCh) > 0 {
		<-lossCh
	}
	start := sub.Received()
	drop := func(seq uint64) bool { return seq >= start[0] && seq < start[0]+5 }
	short.pub.DropLive = drop
	none.pub.DropLive = func(seq uint64) bool { return seq >= start[1] && seq < start[1]+3 }
	scratch := radix.NewTree()
	short.publish(t, 6, scratch)
	none.publish(t, 4, scratch)
	settle(t, sub, short, none)
	close(lossCh)
	for l := range lossCh {
		heard = append(heard, l)
	}
	st := sub.Stats()
	if st.GapsFound-base.GapsFound != 2 || st.GapsLost-base.GapsLost != 2 || st.GapsRepaired != base.GapsRepaired || st.BatchesLost-base.BatchesLost != 4+3 {
		t.Fatalf("stats %+v, after connecting %+v", st, base)
	}
	if len(heard) != 2 || len(st.RecentLosses)-len(base.RecentLosses) != 2 {
		t.Fatalf("losses %v", heard)
	}
	for _, l := range heard {
		switch l.Worker {
		case 1:
			// The ring held the last 2 batches: the 5th dropped and the
			// live one; the first 4 are lost.
			if l.First != start[0] || l.Last != start[0]+3 || !strings.Contains(l.Reason, "replay buffer") {
				t.Errorf("loss %v", l)
			}
		case 2:
			if l.First != start[1] || l.Last != start[1]+2 || !strings.Contains(l.Reason, "no replay") {
				t.Errorf("loss %v", l)
			}
		}
	}
}

func TestSubscriberLifecycle(t *testing.T) {
	pool := shardpool.NewPool(1, bs)
	defer pool.Close()
	if _, err := NewSubscriber(pool, SubscriberConfig{}); err == nil {
		t.Fatal("block size 0 accepted")
	}
	if _, err := NewSubscriber(pool, SubscriberConfig{BlockSize: bs}, Endpoint{Address: "nonsense://x"}); err == nil {
		t.Fatal("bad endpoint accepted")
	}
	sub, err := NewSubscriber(pool, SubscriberConfig{BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if sub.Close() != ErrClosed || sub.Flush() != ErrClosed {
		t.Fatal("calls after close must fail")
	}
}

// TestPublisherAfterClose: a closed publisher refuses work and lets go of
// its ring (a closed engine's payloads must not stay live).
func TestPublisherAfterClose(t *testing.T) {
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p.ring != nil {
		t.Fatal("a closed publisher still holds its replay ring")
	}
	if _, err := p.Publish(nil); !errors.Is(err, ErrPublisherClosed) {
		t.Fatalf("publish after close: %v", err)
	}
	if err := p.Close(); !errors.Is(err, ErrPublisherClosed) {
		t.Fatalf("second close: %v", err)
	}
}

// Media end to end: an engine publishes a chain on the GPU, offloads its
// tail to the CPU ("CPU": removed from the GPU, stored on the host) and
// spills a block to disk; over ZeroMQ into an indexer that keeps tiers,
// the worker's cumulative prefixes per tier say so.
func TestMediaToTiers(t *testing.T) {
	e := newEngine(t, 1, PublisherConfig{Topic: "kv@e@m", ReplayEndpoint: "x"})
	idx := shardpool.NewSingleTiers(bs)
	defer idx.Close()
	sub, err := NewSubscriber(idx, SubscriberConfig{BlockSize: bs}, e.endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	connect(t, sub, e)
	tokens := make([]uint32, 4*bs)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	p1, p2 := uint64(11), uint64(13)
	for _, evs := range [][]Event{
		{{Type: BlockStored, BlockHashes: []uint64{11, 12, 13}, TokenIDs: tokens[:3*bs], BlockSize: bs, Medium: "GPU"}},
		{{Type: BlockStored, BlockHashes: []uint64{12, 13}, ParentBlockHash: &p1, TokenIDs: tokens[bs : 3*bs], BlockSize: bs, Medium: "CPU"},
			{Type: BlockRemoved, BlockHashes: []uint64{12, 13}, Medium: "GPU"}},
		{{Type: BlockStored, BlockHashes: []uint64{14}, ParentBlockHash: &p2, TokenIDs: tokens[3*bs:], BlockSize: bs, Medium: "DISK"}},
	} {
		if _, err := e.pub.Publish(evs); err != nil {
			t.Fatal(err)
		}
	}
	settle(t, sub, e)
	local := hashing.LocalHashes(nil, tokens, bs, hashing.Options{})
	got, err := idx.FindTierMatches(local)
	if err != nil {
		t.Fatal(err)
	}
	if want := ([kvevent.NumTiers]uint32{1, 3, 4, 4}); got.Scores[kvevent.Worker{ID: 1}] != want {
		t.Fatalf("tier scores %v, want worker 1 at %v (%+v, %+v)", got.Scores, want, idx.Stats(), sub.Stats().Convert)
	}
}
