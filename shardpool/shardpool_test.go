package shardpool_test

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
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

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaks.Ignore()...) }

// impls is the one implementation table (shardpool.ParseImpls, as the
// benchmarks and loadgen use it): every indexer, pools at 1, 2 and 4 lanes.
var impls = func() []shardpool.Impl {
	ims, err := shardpool.ParseImpls(strings.Join(shardpool.ImplNames, ","), []int{1, 2, 4})
	if err != nil {
		panic(err)
	}
	return ims
}()

func forEach(t *testing.T, f func(t *testing.T, idx shardpool.Indexer)) {
	for _, im := range impls {
		t.Run(im.String(), func(t *testing.T) {
			idx := im.New(4)
			defer idx.Close()
			f(t, idx)
		})
	}
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func flush(t *testing.T, idx shardpool.Indexer) int {
	t.Helper()
	n, err := idx.Flush()
	check(t, err)
	return n
}

func find(t *testing.T, idx shardpool.Indexer, tokens []uint32, lora string) radix.OverlapScores {
	t.Helper()
	s, err := idx.FindMatchesForRequest(tokens, lora)
	check(t, err)
	return s
}

func match(t *testing.T, idx shardpool.Indexer, local []uint64) radix.OverlapScores {
	t.Helper()
	s, err := idx.FindMatches(local)
	check(t, err)
	return s
}

// storedTokens is a Stored event of worker 7 holding the blocks of tokens.
func storedTokens(tier kvevent.Tier, tokens []uint32) kvevent.RouterEvent {
	local := hashing.LocalHashes(nil, tokens, 4, hashing.Options{})
	s := kvevent.Stored{}
	for i, h := range local {
		s.Blocks = append(s.Blocks, kvevent.StoredBlock{BlockHash: uint64(100 + i), TokensHash: h})
	}
	return kvevent.RouterEvent{WorkerID: 7, Tier: tier, Event: kvevent.Event{ID: 1, Data: s}}
}

// The reference's storage-tier check: only Device-tier events count.
func TestStorageTiers(t *testing.T) {
	forEach(t, func(t *testing.T, idx shardpool.Indexer) {
		tokens := []uint32{1, 2, 3, 4}
		w7 := kvevent.Worker{ID: 7}
		check(t, idx.ApplyEvent(storedTokens(kvevent.TierHostPinned, tokens)))
		flush(t, idx)
		got := find(t, idx, tokens, "")
		if _, ok := got.Scores[w7]; ok {
			t.Fatalf("host-pinned store scored: %v", got.Scores)
		}
		if st := idx.Stats(); st.IgnoredTier != 1 || st.Applied != 0 {
			t.Fatalf("stats %+v", st)
		}
		check(t, idx.ApplyEvent(storedTokens(kvevent.TierDevice, tokens)))
		flush(t, idx)
		got = find(t, idx, tokens, "")
		if got.Scores[w7] != 1 {
			t.Fatalf("device store: %v, want worker 7 scored 1", got.Scores)
		}
		if other := find(t, idx, tokens, "lora"); len(other.Scores) != 0 {
			t.Fatalf("a LoRA request matched base-model blocks: %v", other.Scores)
		}
	})
}

func TestRejectionsAreCounted(t *testing.T) {
	forEach(t, func(t *testing.T, idx shardpool.Indexer) {
		w := kvevent.Worker{ID: 3, DPRank: 1}
		evs := []kvevent.RouterEvent{
			radixtest.Stored(w, -1, 10, 1, 11, 2),
			radixtest.Stored(w, 99, 12, 3),        // parent unknown
			radixtest.Removed(w, 11, 77, 78),      // two unknown
			{WorkerID: 3, Event: kvevent.Event{}}, // no data
			radixtest.Stored(w, 10, 10, 4),        // its own parent
		}
		for _, e := range evs {
			check(t, idx.ApplyEvent(e))
		}
		if n := flush(t, idx); n != 5 {
			t.Fatalf("flush reports %d events, want 5", n)
		}
		st := idx.Stats()
		if st.Applied != 1 || st.ParentNotFound != 1 || st.BlockNotFound != 1 || st.BlocksNotFound != 2 || st.Invalid != 1 || st.SelfParent != 1 || st.Rejected() != 4 {
			t.Fatalf("stats %+v", st)
		}
		if !strings.Contains(st.LastRejection, "worker 3") {
			t.Fatalf("last rejection %q does not name the worker", st.LastRejection)
		}
		if got := match(t, idx, []uint64{1, 2}); !maps.Equal(got.Scores, map[kvevent.Worker]uint32{w: 1}) {
			t.Fatalf("scores %v", got.Scores)
		}
		if n := flush(t, idx); n != 0 {
			t.Fatalf("second flush reports %d", n)
		}
	})
}

func TestRemoveWorkerIsOrdered(t *testing.T) {
	forEach(t, func(t *testing.T, idx shardpool.Indexer) {
		for r := range kvevent.DPRank(3) {
			check(t, idx.ApplyEvent(radixtest.Stored(kvevent.Worker{ID: 5, DPRank: r}, -1, 10, 1)))
		}
		check(t, idx.ApplyEvent(radixtest.Stored(kvevent.Worker{ID: 6}, -1, 10, 1)))
		check(t, idx.RemoveWorker(5))
		check(t, idx.ApplyEvent(radixtest.Stored(kvevent.Worker{ID: 5, DPRank: 2}, -1, 11, 1)))
		flush(t, idx)
		got := match(t, idx, []uint64{1})
		want := map[kvevent.Worker]uint32{{ID: 6}: 1, {ID: 5, DPRank: 2}: 1}
		if !maps.Equal(got.Scores, want) {
			t.Fatalf("scores %v, want %v", got.Scores, want)
		}
		if st := idx.Stats(); st.RemovedWorkers != 1 || st.Pairs != 2 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestCloseDrainsAndThenRefuses(t *testing.T) {
	for _, im := range impls {
		t.Run(im.String(), func(t *testing.T) {
			idx := im.New(4)
			const n = 3 * shardpool.QueueSize / 2
			for i := range n {
				w := kvevent.Worker{ID: kvevent.WorkerID(i % 5)}
				check(t, idx.ApplyEvent(radixtest.Stored(w, -1, uint64(i), uint64(i%100))))
			}
			if err := idx.Close(); err != nil {
				t.Fatal(err)
			}
			if st := idx.Stats(); st.Applied != n || st.QueueDepth != 0 {
				t.Fatalf("after close: %d of %d applied, %d queued", st.Applied, n, st.QueueDepth)
			}
			for name, err := range map[string]error{
				"ApplyEvent":   idx.ApplyEvent(radixtest.Cleared(kvevent.Worker{})),
				"RemoveWorker": idx.RemoveWorker(1),
				"Close":        idx.Close(),
			} {
				if !errors.Is(err, shardpool.ErrClosed) {
					t.Errorf("%s after close: %v", name, err)
				}
			}
			if _, err := idx.Flush(); !errors.Is(err, shardpool.ErrClosed) {
				t.Errorf("Flush after close: %v", err)
			}
			if _, err := idx.FindMatches([]uint64{1}); !errors.Is(err, shardpool.ErrClosed) {
				t.Errorf("FindMatches after close: %v", err)
			}
		})
	}
}

func TestBadBlockSize(t *testing.T) {
	for _, im := range impls {
		idx := im.New(0)
		if _, err := idx.FindMatchesForRequest([]uint32{1, 2}, ""); err == nil {
			t.Errorf("%s: block size 0 accepted", im)
		}
		idx.Close()
	}
}

// TestConcurrentProducersAndReaders feeds each worker's random stream from
// its own goroutine while readers query, then checks the flushed index
// against the model built from the same streams.
func TestConcurrentProducersAndReaders(t *testing.T) {
	forEach(t, func(t *testing.T, idx shardpool.Indexer) {
		const producers = 6
		models := make([]*radixtest.Model, producers)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var readers sync.WaitGroup
		for i := range 3 {
			readers.Add(1)
			go func() {
				defer readers.Done()
				r := rand.New(rand.NewPCG(uint64(i), 9))
				for {
					select {
					case <-stop:
						return
					default:
					}
					q := []uint64{uint64(1 + r.IntN(3)), uint64(1 + r.IntN(3))}
					if _, err := idx.FindMatches(q); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		for p := range producers {
			models[p] = radixtest.NewModel()
			wg.Add(1)
			go func() {
				defer wg.Done()
				g := &radixtest.Gen{Src: rand.New(rand.NewPCG(uint64(p), 8)), Model: radixtest.NewModel()}
				for range 300 {
					op := g.Next()
					if op.Kind != radixtest.OpEvent {
						continue
					}
					// Give producer p its own worker ids.
					op.Event.WorkerID = kvevent.WorkerID(p*10) + op.Event.WorkerID
					_ = g.Model.Apply(op.Event)
					_ = models[p].Apply(op.Event)
					if err := idx.ApplyEvent(op.Event); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		readers.Wait()
		flush(t, idx)
		for a := uint64(1); a <= 3; a++ {
			for b := uint64(1); b <= 3; b++ {
				q := []uint64{a, b, 1, 2, 3}
				got := match(t, idx, q).Scores
				want := map[kvevent.Worker]uint32{}
				for _, m := range models {
					maps.Copy(want, m.Scores(q))
				}
				if !maps.Equal(got, want) {
					t.Fatalf("query %v: %v, want %v", q, got, want)
				}
			}
		}
	})
}

func TestPoolBatchStats(t *testing.T) {
	p := shardpool.NewPool(2, 4)
	defer p.Close()
	for i := range 10000 {
		check(t, p.ApplyEvent(radixtest.Stored(kvevent.Worker{ID: kvevent.WorkerID(i % 8)}, -1, uint64(i), 1)))
	}
	flush(t, p)
	st := p.Stats()
	if st.Batches == 0 || st.BatchedEvents < 10000 || st.MaxBatch < 1 || st.MeanBatch() < 1 || st.Queued != 10000 {
		t.Fatalf("stats %+v", st)
	}
	if p.Lanes() != 2 || p.Index().Size() != 8 {
		t.Fatalf("lanes %d size %d", p.Lanes(), p.Index().Size())
	}
}

// TestZeroValues: an indexer not made by its constructor fails every call
// with ErrNotStarted; before, ApplyEvent blocked forever on a nil channel.
func TestZeroValues(t *testing.T) {
	for name, idx := range map[string]shardpool.Indexer{"single": &shardpool.Single{}, "pool": &shardpool.Pool{}} {
		done := make(chan []error, 1)
		go func() {
			ev := radixtest.Stored(kvevent.Worker{ID: 1}, -1, 10, 1)
			_, e1 := idx.FindMatches([]uint64{1})
			_, e2 := idx.FindMatchesForRequest(make([]uint32, 32), "")
			_, e3 := idx.Flush()
			ev2 := ev
			ev2.Tier = kvevent.TierHostPinned
			done <- []error{idx.ApplyEvent(ev), idx.ApplyEvent(ev2), e1, e2, idx.RemoveWorker(1), e3, idx.Close()}
		}()
		select {
		case errs := <-done:
			for i, err := range errs {
				if !errors.Is(err, shardpool.ErrNotStarted) {
					t.Errorf("%s: call %d: %v, want ErrNotStarted", name, i, err)
				}
			}
			if st := idx.Stats(); st.Queued != 0 || st.Pairs != 0 {
				t.Errorf("%s: stats %+v", name, st)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: a call on the zero value blocked", name)
		}
	}
}

// churnIndexer drives an indexer as radixtest.Churn's index: every call
// waits for the queues to drain.
type churnIndexer struct {
	t   *testing.T
	idx shardpool.Indexer
}

func (c churnIndexer) Apply(ev kvevent.RouterEvent) error { return c.idx.ApplyEvent(ev) }

func (c churnIndexer) RemoveWorker(id kvevent.WorkerID) {
	if err := c.idx.RemoveWorker(id); err != nil {
		c.t.Fatal(err)
	}
}

func (c churnIndexer) Size() int {
	if _, err := c.idx.Flush(); err != nil {
		c.t.Fatal(err)
	}
	st := c.idx.Stats()
	if st.Rejected() != 0 {
		c.t.Fatalf("rejections during churn: %+v", st)
	}
	return st.Pairs
}

// TestChurn: every indexer gives back what departed workers held.
func TestChurn(t *testing.T) {
	for _, im := range impls {
		t.Run(im.String(), func(t *testing.T) {
			idx := im.New(4)
			defer idx.Close()
			radixtest.Churn(t, churnIndexer{t, idx}, 1<<20)
		})
	}
}

func TestParseImpls(t *testing.T) {
	impls, err := shardpool.ParseImpls("single, pool,compressed", []int{1, 4})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, im := range impls {
		got = append(got, im.String())
		idx := im.New(4)
		if err := idx.Close(); err != nil {
			t.Fatal(err)
		}
	}
	want := "impl=single impl=pool/lanes=1 impl=pool/lanes=4 impl=compressed/lanes=1 impl=compressed/lanes=4"
	if strings.Join(got, " ") != want {
		t.Fatalf("impls %v, want %s", got, want)
	}
	sized := shardpool.Impl{Name: "compressed", Lanes: 2, Blocks: 10_000}
	idx := sized.New(4)
	check(t, idx.ApplyEvent(storedTokens(kvevent.TierDevice, make([]uint32, 8))))
	if flush(t, idx); sized.String() != "impl=compressed/lanes=2/sized" || idx.Stats().Pairs != 2 {
		t.Fatalf("sized: %s, %d pairs", sized, idx.Stats().Pairs)
	}
	check(t, idx.Close())
	if _, err := shardpool.ParseImpls("single,btree", []int{1}); err == nil || !strings.Contains(err.Error(), "btree") {
		t.Fatalf("unknown name: %v", err)
	}
	if _, err := shardpool.ParseImpls("compressed, compressed", []int{1}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a name given twice: %v", err)
	}
	for n, want := range map[int]int{-1: 1, 0: 1, 3: 3, shardpool.MaxLanes + 1: shardpool.MaxLanes, 1 << 40: shardpool.MaxLanes} {
		p := shardpool.NewPool(n, 4)
		if got := p.Lanes(); got != want {
			t.Errorf("NewPool(%d): %d lanes, want %d", n, got, want)
		}
		check(t, p.Close())
	}
	for _, bad := range []string{"2,0", "99999999999", fmt.Sprint(shardpool.MaxLanes + 1), "2, 2"} {
		if _, err := shardpool.ParseLanes(bad); err == nil {
			t.Fatalf("lane counts %s accepted", bad)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("an unknown hand-built Impl started an indexer")
		}
	}()
	shardpool.Impl{Name: "btree"}.New(4)
}

// A Cleared event clears the rank that sent it; the worker's other ranks
// keep their blocks (radix, Semantics), in every indexer.
func TestClearedClearsOneRank(t *testing.T) {
	forEach(t, func(t *testing.T, idx shardpool.Indexer) {
		r0, r1 := kvevent.Worker{ID: 4}, kvevent.Worker{ID: 4, DPRank: 1}
		for _, e := range []kvevent.RouterEvent{radixtest.Stored(r0, -1, 10, 1), radixtest.Stored(r1, -1, 10, 1), radixtest.Cleared(r0)} {
			check(t, idx.ApplyEvent(e))
		}
		flush(t, idx)
		if got := match(t, idx, []uint64{1}); !maps.Equal(got.Scores, map[kvevent.Worker]uint32{r1: 1}) {
			t.Fatalf("after rank 0 cleared: %v, want rank 1 alone", got.Scores)
		}
	})
}

// The indexers that keep tiers keep the host-pinned store: not in the
// device scores, but in the device-or-host prefix; an offload (the device
// copy removed) leaves it there; a shared store counts for its members.
func TestTiers(t *testing.T) {
	for name, newIdx := range map[string]func() shardpool.TierIndexer{
		"single": func() shardpool.TierIndexer { return shardpool.NewSingleTiers(4) },
		"pool":   func() shardpool.TierIndexer { return shardpool.NewPoolTiers(2, 4) },
		"pool/concurrent": func() shardpool.TierIndexer {
			return shardpool.NewPoolTiersOver(2, 4, radix.NewConcurrentTree())
		},
	} {
		t.Run(name, func(t *testing.T) { testTiers(t, newIdx()) })
	}
	pool := shardpool.NewPool(2, 4)
	defer pool.Close()
	if _, err := pool.FindTierMatches(nil); err == nil || pool.KeepsTiers() {
		t.Fatal("a pool keeping the device tier only answered for tiers")
	}
}

func testTiers(t *testing.T, idx shardpool.TierIndexer) {
	defer idx.Close()
	if !idx.KeepsTiers() {
		t.Fatal("does not keep tiers")
	}
	tokens := []uint32{1, 2, 3, 4}
	w7 := kvevent.Worker{ID: 7}
	check(t, idx.ApplyEvent(storedTokens(kvevent.TierDevice, tokens)))
	check(t, idx.ApplyEvent(storedTokens(kvevent.TierHostPinned, tokens)))
	check(t, idx.ApplyEvent(kvevent.RouterEvent{WorkerID: 7, Event: kvevent.Event{ID: 2, Data: kvevent.Removed{BlockHashes: []uint64{100}}}}))
	flush(t, idx)
	local := hashing.LocalHashes(nil, tokens, 4, hashing.Options{})
	got, err := idx.FindTierMatches(local)
	if err != nil {
		t.Fatal(err)
	}
	if want := ([kvevent.NumTiers]uint32{0, 1, 1, 1}); got.Scores[w7] != want {
		t.Fatalf("tier scores %v, want worker 7 at %v", got.Scores, want)
	}
	if d := find(t, idx, tokens, ""); len(d.Scores) != 0 {
		t.Fatalf("device scores %v after the offload", d.Scores)
	}
	if st := idx.Stats(); st.IgnoredTier != 0 || st.Applied != 3 {
		t.Fatalf("stats %+v", st)
	}
	// A shared store (worker 9) serving workers 7 and 8: its disk copy of
	// the block counts for both.
	pool, w8 := kvevent.Worker{ID: 9}, kvevent.Worker{ID: 8}
	check(t, idx.SetGroup(pool, []kvevent.Worker{w7, w8}))
	shared := storedTokens(kvevent.TierDisk, tokens)
	shared.WorkerID = 9
	check(t, idx.ApplyEvent(shared))
	flush(t, idx)
	if got, err = idx.FindTierMatches(local); err != nil || got.Scores[w8] != ([kvevent.NumTiers]uint32{0, 0, 1, 1}) || len(got.Scores) != 2 {
		t.Fatalf("with the shared store: %v (%v), want workers 7 and 8, 8 from disk", got.Scores, err)
	}
}

// Pool.AppendMatches answers what FindMatches answers, over either
// concurrent index, and allocates nothing over the compressed tree.
func TestPoolAppendMatches(t *testing.T) {
	for _, p := range []*shardpool.Pool{shardpool.NewPool(2, 4), shardpool.NewPoolOver(2, 4, radix.NewCompressedTree())} {
		for w := range kvevent.WorkerID(5) {
			s := kvevent.Stored{}
			for i := range 3 + int(w) {
				s.Blocks = append(s.Blocks, kvevent.StoredBlock{BlockHash: uint64(w)<<8 | uint64(i), TokensHash: uint64(i + 1)})
			}
			check(t, p.ApplyEvent(kvevent.RouterEvent{WorkerID: w, Event: kvevent.Event{ID: 1, Data: s}}))
		}
		flush(t, p)
		for _, q := range [][]uint64{{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2}, {9}, nil} {
			got, err := p.AppendMatches(nil, q)
			check(t, err)
			want := match(t, p, q)
			if len(got) != len(want.Scores) {
				t.Fatalf("%v: %d matches, FindMatches %d", q, len(got), len(want.Scores))
			}
			for _, m := range got {
				if want.Scores[m.Worker] != m.Score || want.TreeSizes[m.Worker] != m.TreeSize {
					t.Fatalf("%v: %+v, FindMatches %d, %d", q, m, want.Scores[m.Worker], want.TreeSizes[m.Worker])
				}
			}
		}
		if _, ok := p.Index().(*radix.CompressedTree); ok && !raceEnabled {
			buf, q := make([]radix.Match, 0, 16), []uint64{1, 2, 3, 4}
			if n := testing.AllocsPerRun(100, func() { buf, _ = p.AppendMatches(buf[:0], q) }); n != 0 {
				t.Fatalf("%v allocations a lookup", n)
			}
		}
		check(t, p.Close())
		if _, err := p.AppendMatches(nil, []uint64{1}); err == nil {
			t.Fatal("AppendMatches after Close")
		}
	}
}
