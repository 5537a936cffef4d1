package radixtest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// EverHeld records every path each worker has held, for readers racing
// writers: a concurrent index may answer a query with what it held at any
// moment, mid-event included, but never with a prefix of the query that
// the worker never held. The writer applies each event to the model
// through Apply before giving it to the index; readers check their
// scores. It is safe for concurrent use; its zero value is empty.
type EverHeld struct {
	mu    sync.RWMutex
	paths map[kvevent.Worker]map[string]bool
}

// Apply applies ev to m and records every path each worker holds
// afterwards, and every path ev's blocks were stored at: mid-event, a
// worker holds each block the event stores, even one whose engine hash a
// later block of the same event re-points.
func (e *EverHeld) Apply(m *Model, ev kvevent.RouterEvent) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.paths == nil {
		e.paths = map[kvevent.Worker]map[string]bool{}
	}
	if d, ok := ev.Event.Data.(kvevent.Stored); ok {
		e.stored(m, ev.Worker(), d)
	}
	err := m.Apply(ev)
	for _, w := range m.Workers() {
		for p := range m.Paths(w) {
			e.add(w, p)
		}
	}
	return err
}

// stored records the paths d's blocks are stored at, if m finds its parent.
func (e *EverHeld) stored(m *Model, w kvevent.Worker, d kvevent.Stored) {
	path := ""
	if d.HasParent {
		mw := m.workers[w]
		if mw == nil {
			return
		}
		p, ok := mw.byHash[d.ParentHash]
		if !ok {
			return
		}
		path = p
	}
	for _, b := range d.Blocks {
		path = extend(path, b.TokensHash)
		e.add(w, path)
	}
}

func (e *EverHeld) add(w kvevent.Worker, path string) {
	ps := e.paths[w]
	if ps == nil {
		ps = map[string]bool{}
		e.paths[w] = ps
	}
	ps[path] = true
}

// Check returns an error if w scored on query more leading blocks than
// any recorded state of w held without a gap: each prefix query[:i+1],
// i < score, must be a path w has held.
func (e *EverHeld) Check(w kvevent.Worker, query []uint64, score uint32) error {
	if int(score) > len(query) {
		return fmt.Errorf("worker %v scored %d on a query of %d blocks", w, score, len(query))
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	ps := e.paths[w]
	p := ""
	for i, h := range query[:score] {
		p = extend(p, h)
		if !ps[p] {
			return fmt.Errorf("worker %v scored %d on %v: it never held its first %d blocks", w, score, query, i+1)
		}
	}
	return nil
}

// appender is the allocation-free lookup of radix.CompressedTree.
type appender interface {
	AppendMatches(dst []radix.Match, local []uint64, earlyExit bool) []radix.Match
}

// RaceReader starts a goroutine that asks idx random queries over the
// generator's tokens hashes (1 to 3), by every lookup idx has, while the
// caller writes, and checks every score against e: no worker may be scored
// for a prefix it never held. The returned stop ends it, waits for it and
// reports the first wrong score as an error of t. For an index that is not
// a radix.ConcurrentIndex it does nothing.
func RaceReader(t testing.TB, idx radix.Index, e *EverHeld, seed uint64) (stop func()) {
	if _, ok := idx.(radix.ConcurrentIndex); !ok {
		return func() {}
	}
	var halt atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- raceRead(idx, e, rand.New(rand.NewPCG(seed, 7)), &halt)
	}()
	return func() {
		halt.Store(true)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func raceRead(idx radix.Index, e *EverHeld, r *rand.Rand, halt *atomic.Bool) error {
	var matches []radix.Match
	q := make([]uint64, 0, 8)
	for !halt.Load() {
		q = q[:1+r.IntN(8)]
		for i := range q {
			q[i] = uint64(1 + r.IntN(3))
		}
		for w, s := range idx.FindMatches(q, r.IntN(2) == 0).Scores {
			if err := e.Check(w, q, s); err != nil {
				return fmt.Errorf("FindMatches: %w", err)
			}
		}
		if a, ok := idx.(appender); ok {
			matches = a.AppendMatches(matches[:0], q, false)
			for _, m := range matches {
				if err := e.Check(m.Worker, q, m.Score); err != nil {
					return fmt.Errorf("AppendMatches: %w", err)
				}
			}
		}
		if ti, ok := idx.(radix.TierIndex); ok && r.IntN(4) == 0 {
			for w, sc := range ti.FindTierMatches(q).Scores {
				if err := e.Check(w, q, sc[kvevent.NumTiers-1]); err != nil {
					return fmt.Errorf("FindTierMatches: %w", err)
				}
			}
		}
	}
	return nil
}
