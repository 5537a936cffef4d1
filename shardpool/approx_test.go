package shardpool_test

import (
	"encoding/binary"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// chain returns a prompt of n blocks whose first shared blocks are prefix
// p's and the rest request r's own: its local and sequence hashes.
func chain(p, shared, r, n int) (local, seq []uint64) {
	for j := range n {
		if j < shared {
			local = append(local, uint64(p)<<32|uint64(j)+1)
		} else {
			local = append(local, uint64(r)<<40|uint64(j)+1)
		}
	}
	return local, hashing.SequenceHashes(nil, local)
}

func reqID(i int) uuid.UUID {
	var id uuid.UUID
	binary.BigEndian.PutUint64(id[8:], uint64(i)+1)
	return id
}

func newApprox(t *testing.T, cfg shardpool.ApproxConfig) *shardpool.Approx {
	t.Helper()
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	a, err := shardpool.NewApprox(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func score(t *testing.T, a *shardpool.Approx, local []uint64) map[kvevent.Worker]uint32 {
	t.Helper()
	res, err := a.FindMatches(local)
	check(t, err)
	return res.Scores
}

var w0, w1 = kvevent.Worker{ID: 0}, kvevent.Worker{ID: 1}

func TestApproxLRUEvictsOldestReleaseDeepestFirst(t *testing.T) {
	a := newApprox(t, shardpool.ApproxConfig{Policy: shardpool.ApproxLRU, Capacity: 6})
	la, sa := chain(1, 3, 1, 3)
	lb, sb := chain(2, 0, 2, 3)
	lc, sc := chain(3, 0, 3, 2)
	check(t, a.Predict(reqID(0), w0, la, sa, 0))
	check(t, a.Predict(reqID(1), w0, lb, sb, 0))
	if got := score(t, a, la)[w0]; got != 3 {
		t.Fatalf("A after routing: %d blocks, want 3", got)
	}
	// Full; both leased: a third request over capacity evicts nothing.
	check(t, a.Predict(reqID(2), w0, lc, sc, 0))
	if a, b := score(t, a, la)[w0], score(t, a, lb)[w0]; a != 3 || b != 3 {
		t.Fatalf("leased blocks evicted: A %d, B %d, want 3 and 3", a, b)
	}
	// B is released first, then A: B is the oldest release; its deepest
	// blocks go first, two of them (8 held, 6 fit).
	for _, i := range []int{1, 0} {
		if ok, err := a.Release(reqID(i)); !ok || err != nil {
			t.Fatalf("release %d: %v %v", i, ok, err)
		}
	}
	if a, b, c := score(t, a, la)[w0], score(t, a, lb)[w0], score(t, a, lc)[w0]; a != 3 || b != 1 || c != 2 {
		t.Fatalf("after releases: A %d, B %d, C %d, want 3, 1, 2", a, b, c)
	}
	if ok, _ := a.Release(reqID(1)); ok {
		t.Fatal("a second release of one request found a lease")
	}
	// A request reusing A's prefix leases it again: A's blocks then outlive
	// B's last one, although A was released after B.
	la2, sa2 := chain(1, 2, 4, 4)
	check(t, a.Predict(reqID(3), w0, la2, sa2, 0))
	if a, b, c := score(t, a, la)[w0], score(t, a, lb)[w0], score(t, a, la2)[w0]; a != 2 || b != 0 || c != 4 {
		t.Fatalf("after reuse: A %d, B %d, A' %d, want 2 (A's third block evicted), 0, 4", a, b, c)
	}
	st := a.ApproxStats()
	if st.Predictions != 4 || st.HitBlocks != 2 || st.Leased != 2 || st.Blocks != 6 {
		t.Fatalf("stats %+v: want 4 predictions, 2 hit blocks, 2 leases, 6 blocks", st)
	}
}

func TestApproxLRUCountsExtraBlocks(t *testing.T) {
	a := newApprox(t, shardpool.ApproxConfig{Policy: shardpool.ApproxLRU, Capacity: 5})
	la, sa := chain(1, 3, 1, 3)
	lb, sb := chain(2, 0, 2, 1)
	check(t, a.Predict(reqID(0), w0, la, sa, 0))
	_, _ = a.Release(reqID(0))
	// B takes 1 block and 2 more for its output: A keeps 2 of 3.
	check(t, a.Predict(reqID(1), w0, lb, sb, 2))
	if got := score(t, a, la)[w0]; got != 2 {
		t.Fatalf("A: %d blocks, want 2", got)
	}
	// B's release frees its output blocks: nothing more is evicted.
	_, _ = a.Release(reqID(1))
	if a, b := score(t, a, la)[w0], score(t, a, lb)[w0]; a != 2 || b != 1 {
		t.Fatalf("after B: A %d, B %d, want 2 and 1", a, b)
	}
	// Capacity per rank: shrinking w0 evicts B first (the older release
	// is A's... A was released before B, so A's blocks go first).
	check(t, a.SetCapacity(w0, 1))
	if a, b := score(t, a, la)[w0], score(t, a, lb)[w0]; a != 0 || b != 1 {
		t.Fatalf("capacity 1: A %d, B %d, want 0 and 1", a, b)
	}
	if err := a.SetCapacity(w0, 0); err == nil {
		t.Fatal("capacity 0 accepted")
	}
}

func TestApproxTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newApprox(t, shardpool.ApproxConfig{Policy: shardpool.ApproxTTL, TTL: 10 * time.Second, Now: func() time.Time { return now }})
	la, sa := chain(1, 3, 1, 3)
	lb, sb := chain(1, 2, 2, 4) // A's first two blocks, then its own
	check(t, a.Predict(reqID(0), w0, la, sa, 0))
	now = now.Add(6 * time.Second)
	check(t, a.Predict(reqID(1), w1, lb, sb, 0))
	check(t, a.Predict(reqID(2), w0, lb[:2], sb[:2], 0)) // refreshes A's first two on w0
	if got := score(t, a, la); got[w0] != 3 || got[w1] != 2 {
		t.Fatalf("at 6 s: %v, want w0 3, w1 2", got)
	}
	if ok, err := a.Release(reqID(0)); ok || err != nil {
		t.Fatalf("ttl release: %v %v, want no lease", ok, err)
	}
	now = now.Add(5 * time.Second) // 11 s: A's third block expired, the refreshed ones not
	if got := score(t, a, la); got[w0] != 2 || got[w1] != 2 {
		t.Fatalf("at 11 s: %v, want w0 2, w1 2", got)
	}
	now = now.Add(-time.Hour) // a clock going back stands still
	now = now.Add(time.Hour + 5*time.Second)
	if got := score(t, a, la); len(got) != 0 {
		t.Fatalf("at 16 s: %v, want nothing", got)
	}
	if st := a.ApproxStats(); st.Expired != 7 || st.Blocks != 0 {
		t.Fatalf("stats %+v: want 7 expired, 0 blocks", st)
	}
	if st := a.Stats(); st.Pairs != 0 || st.Rejected() != 0 {
		t.Fatalf("index stats %+v: want empty, nothing rejected", st)
	}
}

func TestApproxReadsNoEvents(t *testing.T) {
	a := newApprox(t, shardpool.ApproxConfig{Policy: shardpool.ApproxLRU, Capacity: 8})
	var heard []error
	a.Observe(func(_ kvevent.RouterEvent, err error) { heard = append(heard, err) })
	ev := storedTokens(kvevent.TierDevice, make([]uint32, 32))
	check(t, a.ApplyEvent(ev))
	if st := a.Stats(); st.Unread != 1 || st.Pairs != 0 {
		t.Fatalf("stats %+v: want 1 unread, nothing indexed", st)
	}
	if len(heard) != 1 || !errors.Is(heard[0], shardpool.ErrNotRead) {
		t.Fatalf("observer heard %v, want ErrNotRead", heard)
	}
	// Requests are matched by their tokens as the event indexers do.
	tokens := make([]uint32, 40)
	local := hashing.LocalHashes(nil, tokens, 16, hashing.Options{})
	check(t, a.Predict(reqID(0), w1, local, hashing.SequenceHashes(nil, local), 1))
	if res, err := a.FindMatchesForRequest(tokens, ""); err != nil || res.Scores[w1] != 2 {
		t.Fatalf("by tokens: %v %v, want w1 2", res.Scores, err)
	}
	check(t, a.RemoveWorker(1))
	if got := score(t, a, local); len(got) != 0 {
		t.Fatalf("after RemoveWorker: %v", got)
	}
	if ok, _ := a.Release(reqID(0)); ok {
		t.Fatal("a removed worker's lease released")
	}
	check(t, a.Close())
	if err := a.Predict(reqID(1), w0, local, local, 0); !errors.Is(err, shardpool.ErrClosed) {
		t.Fatalf("predict after close: %v", err)
	}
}

func TestApproxRefusesBadInput(t *testing.T) {
	for _, cfg := range []shardpool.ApproxConfig{
		{Policy: 0, BlockSize: 16, Capacity: 1},
		{Policy: shardpool.ApproxLRU, BlockSize: 16},
		{Policy: shardpool.ApproxLRU, Capacity: 1},
		{Policy: shardpool.ApproxTTL, BlockSize: 16, TTL: -1},
	} {
		if _, err := shardpool.NewApprox(cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	a := newApprox(t, shardpool.ApproxConfig{Policy: shardpool.ApproxLRU, Capacity: 8})
	l, s := chain(1, 0, 1, 2)
	if err := a.Predict(reqID(0), w0, l, s[:1], 0); err == nil {
		t.Error("mismatched hashes accepted")
	}
	if err := a.Predict(reqID(0), w0, l, s, -1); err == nil {
		t.Error("negative extra blocks accepted")
	}
	check(t, a.Predict(reqID(0), w0, l, s, 0))
	if err := a.Predict(reqID(0), w1, l, s, 0); err == nil {
		t.Error("a request predicted twice")
	}
}

// lruModel is the LRU policy written plainly: every copy in a slice, the
// free order a slice of releases.
type lruModel struct {
	capacity map[kvevent.Worker]int
	copies   map[kvevent.Worker][]*modelCopy
	extra    map[kvevent.Worker]int
	leases   map[uuid.UUID][]*modelCopy
	leaseW   map[uuid.UUID]kvevent.Worker
	leaseX   map[uuid.UUID]int
	tick     int
}

type modelCopy struct {
	hash     uint64
	leases   int
	released int // the tick of its latest release, deepest block first within one
}

func (m *lruModel) holds(w kvevent.Worker, h uint64) *modelCopy {
	for _, c := range m.copies[w] {
		if c.hash == h {
			return c
		}
	}
	return nil
}

func (m *lruModel) predict(id uuid.UUID, w kvevent.Worker, seq []uint64, extra int) {
	var lease []*modelCopy
	j := 0
	for ; j < len(seq) && m.holds(w, seq[j]) != nil; j++ {
		c := m.holds(w, seq[j])
		c.leases++
		lease = append(lease, c)
	}
	for ; j < len(seq); j++ {
		c := &modelCopy{hash: seq[j], leases: 1}
		m.copies[w] = append([]*modelCopy{c}, m.copies[w]...) // the newest copy first, as the index's chain
		lease = append(lease, c)
	}
	m.leases[id], m.leaseW[id], m.leaseX[id] = lease, w, extra
	m.extra[w] += extra
	m.evict(w)
}

func (m *lruModel) release(id uuid.UUID) {
	w, lease := m.leaseW[id], m.leases[id]
	if lease == nil {
		return
	}
	for j := len(lease) - 1; j >= 0; j-- {
		if lease[j].leases--; lease[j].leases == 0 {
			m.tick++
			lease[j].released = m.tick
		}
	}
	m.extra[w] -= m.leaseX[id]
	delete(m.leases, id)
	m.evict(w)
}

func (m *lruModel) evict(w kvevent.Worker) {
	for len(m.copies[w])+m.extra[w] > m.capacity[w] {
		oldest := -1
		for i, c := range m.copies[w] {
			if c.leases == 0 && (oldest < 0 || c.released < m.copies[w][oldest].released) {
				oldest = i
			}
		}
		if oldest < 0 {
			return
		}
		m.copies[w] = slices.Delete(m.copies[w], oldest, oldest+1)
	}
}

func (m *lruModel) scores(seq []uint64) map[kvevent.Worker]uint32 {
	out := map[kvevent.Worker]uint32{}
	for w := range m.copies {
		n := 0
		for n < len(seq) && m.holds(w, seq[n]) != nil {
			n++
		}
		if n > 0 {
			out[w] = uint32(n)
		}
	}
	return out
}

// TestApproxLRUAgainstModel drives the index and the plain model with the
// same random routings and completions over prefixes shared by many
// requests, and checks every request's scores and the blocks after each
// step.
func TestApproxLRUAgainstModel(t *testing.T) {
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 1))
		againstModel(t, 600, rng.IntN)
	}
}

// FuzzApproxLRU is TestApproxLRUAgainstModel with the fuzzer's choices.
func FuzzApproxLRU(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 200, 100, 50})
	f.Fuzz(func(t *testing.T, data []byte) {
		next := 0
		againstModel(t, len(data)/2, func(n int) int {
			if next >= len(data) {
				return 0
			}
			next++
			return int(data[next-1]) % n
		})
	})
}

// againstModel runs steps random operations (choose(n) picks in [0, n))
// on an index and the model, checking them equal after each.
func againstModel(t *testing.T, steps int, choose func(n int) int) {
	a := newApprox(t, shardpool.ApproxConfig{Policy: shardpool.ApproxLRU, Capacity: 12})
	m := &lruModel{capacity: map[kvevent.Worker]int{}, copies: map[kvevent.Worker][]*modelCopy{}, extra: map[kvevent.Worker]int{},
		leases: map[uuid.UUID][]*modelCopy{}, leaseW: map[uuid.UUID]kvevent.Worker{}, leaseX: map[uuid.UUID]int{}}
	workers := []kvevent.Worker{{ID: 0}, {ID: 1}, {ID: 1, DPRank: 1}}
	for _, w := range workers {
		m.capacity[w] = 12
	}
	var live []uuid.UUID
	var asked [][2][]uint64
	for i := range steps {
		switch op := choose(10); {
		case op < 5 || len(live) == 0:
			local, seq := chain(choose(4), choose(5), i, 1+choose(6))
			w, extra := workers[choose(len(workers))], choose(3)
			check(t, a.Predict(reqID(i), w, local, seq, extra))
			m.predict(reqID(i), w, seq, extra)
			live = append(live, reqID(i))
			asked = append(asked, [2][]uint64{local, seq})
		case op < 9:
			k := choose(len(live))
			if ok, err := a.Release(live[k]); !ok || err != nil {
				t.Fatalf("step %d: release: %v %v", i, ok, err)
			}
			m.release(live[k])
			live = slices.Delete(live, k, k+1)
		default:
			w, c := workers[choose(len(workers))], 4+choose(16)
			check(t, a.SetCapacity(w, c))
			m.capacity[w] = c
			m.evict(w)
		}
		for _, q := range asked[max(0, len(asked)-20):] {
			if got, want := score(t, a, q[0]), m.scores(q[1]); !maps.Equal(got, want) {
				t.Fatalf("step %d: scores %v, model %v", i, got, want)
			}
		}
		blocks := 0
		for _, cs := range m.copies {
			blocks += len(cs)
		}
		if st := a.ApproxStats(); st.Blocks != blocks || st.Leased != len(live) {
			t.Fatalf("step %d: %d blocks %d leases, model %d %d", i, st.Blocks, st.Leased, blocks, len(live))
		}
	}
	if st := a.Stats(); st.Rejected() != 0 {
		t.Fatalf("the tree refused a predicted event: %s", st.LastRejection)
	}
}

func TestApproxForgetsOneRank(t *testing.T) {
	a := newApprox(t, shardpool.ApproxConfig{Policy: shardpool.ApproxLRU, Capacity: 100})
	r1 := kvevent.Worker{ID: 0, DPRank: 1}
	l, s := chain(1, 3, 1, 3)
	check(t, a.Predict(reqID(0), w0, l, s, 0))
	check(t, a.Predict(reqID(1), r1, l, s, 0))
	check(t, a.Forget(w0))
	check(t, a.Forget(kvevent.Worker{ID: 9})) // never predicted: nothing to do
	if got := score(t, a, l); len(got) != 1 || got[r1] != 3 {
		t.Fatalf("after forgetting rank 0: %v, want rank 1's 3 blocks alone", got)
	}
	if ok, _ := a.Release(reqID(0)); ok {
		t.Fatal("a forgotten rank's lease released")
	}
	if st := a.ApproxStats(); st.Blocks != 3 || st.Leased != 1 {
		t.Fatalf("stats %+v: want 3 blocks, 1 lease", st)
	}
}
