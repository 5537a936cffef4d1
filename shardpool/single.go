package shardpool

import (
	"slices"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// Single is the single-threaded indexer, as Dynamo's KvIndexer: one
// goroutine owns a radix.Tree, and events, queries, removals and flushes all
// reach it through one channel, so a query sees every event queued before
// it by the same caller. It is the baseline the Pool is measured against.
// Its semantics are package radix's, like every indexer's: unlike
// KvIndexer, a Cleared event clears the rank that sent it, not every rank
// of the worker (see radix, Semantics).
//
// All methods are safe for concurrent use.
type Single struct {
	h     *hasher
	ch    chan msg
	gate  gate
	done  chan struct{}
	c     counters
	tiers bool // keep every tier (NewSingleTiers)
}

type msgKind uint8

const (
	msgEvent msgKind = iota
	msgMatch
	msgTierMatch
	msgGroup
	msgRemove
	msgFlush
)

type msg struct {
	kind    msgKind
	ev      kvevent.RouterEvent
	local   []uint64
	id      kvevent.WorkerID
	holder  kvevent.Worker   // msgGroup
	members []kvevent.Worker // msgGroup
	reply   chan result
}

type result struct {
	scores radix.OverlapScores
	tiers  radix.TierScores
	n      int
}

// NewSingle starts a single-threaded indexer for the given block size.
func NewSingle(blockSize int) *Single {
	s := &Single{h: newHasher(blockSize), ch: make(chan msg, QueueSize), done: make(chan struct{})}
	s.gate.open()
	go s.run(radix.NewTree())
	return s
}

// NewSingleTiers is NewSingle keeping every tier: events of the host,
// disk and external tiers are indexed too (radix.TierIndex), and
// FindTierMatches reports each worker's cumulative prefix per tier.
func NewSingleTiers(blockSize int) *Single {
	s := NewSingle(blockSize)
	s.tiers = true
	return s
}

var (
	_ Indexer     = (*Single)(nil)
	_ TierIndexer = (*Single)(nil)
)

func (s *Single) run(tree *radix.Tree) {
	defer close(s.done)
	applied := 0
	for m := range s.ch {
		switch m.kind {
		case msgEvent:
			s.c.done(m.ev, tree.Apply(m.ev))
			s.c.pairs.Store(int64(tree.Size()))
			applied++
		case msgMatch:
			m.reply <- result{scores: tree.FindMatches(m.local, false)}
		case msgTierMatch:
			m.reply <- result{tiers: tree.FindTierMatches(m.local)}
		case msgGroup:
			tree.SetGroup(m.holder, m.members)
		case msgRemove:
			tree.RemoveWorker(m.id)
			s.c.pairs.Store(int64(tree.Size()))
			s.c.removedWorkers.Add(1)
		case msgFlush:
			m.reply <- result{n: applied}
			applied = 0
		}
	}
}

// send queues m unless the indexer is closed.
func (s *Single) send(m msg) error {
	if err := s.gate.enter(); err != nil {
		return err
	}
	s.ch <- m
	s.gate.leave()
	return nil
}

// call queues m and waits for its reply.
func (s *Single) call(m msg) (result, error) {
	m.reply = make(chan result, 1)
	if err := s.send(m); err != nil {
		return result{}, err
	}
	return <-m.reply, nil
}

// ApplyEvent implements Indexer.
func (s *Single) ApplyEvent(ev kvevent.RouterEvent) error {
	if !ev.Tier.IsGPU() && !s.tiers {
		if err := s.gate.usable(); err != nil {
			return err
		}
		s.c.ignoredTier.Add(1)
		return nil
	}
	if err := s.send(msg{kind: msgEvent, ev: ev}); err != nil {
		return err
	}
	s.c.queued.Add(1)
	storeMax(&s.c.maxDepth, int64(len(s.ch)))
	return nil
}

// FindMatches implements Indexer; the match runs on the indexer goroutine.
func (s *Single) FindMatches(local []uint64) (radix.OverlapScores, error) {
	r, err := s.call(msg{kind: msgMatch, local: local})
	return r.scores, err
}

// KeepsTiers implements TierIndexer.
func (s *Single) KeepsTiers() bool { return s.tiers }

// FindTierMatches implements TierIndexer; without NewSingleTiers only the
// device tier is held, so every tier's prefix is the device's.
func (s *Single) FindTierMatches(local []uint64) (radix.TierScores, error) {
	r, err := s.call(msg{kind: msgTierMatch, local: local})
	return r.tiers, err
}

// SetGroup implements TierIndexer, ordered after the events queued before
// it.
func (s *Single) SetGroup(holder kvevent.Worker, members []kvevent.Worker) error {
	return s.send(msg{kind: msgGroup, holder: holder, members: slices.Clone(members)})
}

// FindMatchesForRequest implements Indexer.
func (s *Single) FindMatchesForRequest(tokens []uint32, lora string) (radix.OverlapScores, error) {
	if err := s.gate.usable(); err != nil {
		return radix.OverlapScores{}, err
	}
	return s.h.match(tokens, lora, s.FindMatches)
}

// RemoveWorker implements Indexer.
func (s *Single) RemoveWorker(id kvevent.WorkerID) error {
	return s.send(msg{kind: msgRemove, id: id})
}

// Flush implements Indexer.
func (s *Single) Flush() (int, error) {
	r, err := s.call(msg{kind: msgFlush})
	return r.n, err
}

// Close implements Indexer.
func (s *Single) Close() error {
	if err := s.gate.shut(); err != nil {
		return err
	}
	close(s.ch)
	<-s.done
	return nil
}

// Stats implements Indexer.
func (s *Single) Stats() Stats { return s.c.stats(len(s.ch)) }

// Lanes implements Indexer: one goroutine owns the tree.
func (s *Single) Lanes() int { return 1 }

// BlockSize implements Indexer.
func (s *Single) BlockSize() int { return s.h.blockSize }

// Observe implements Indexer.
func (s *Single) Observe(f func(ev kvevent.RouterEvent, err error)) { s.c.observe = f }
