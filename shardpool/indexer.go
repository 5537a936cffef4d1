// Package shardpool holds the indexers: the goroutines and queues that own a
// radix index, apply the event stream to it, and answer overlap queries.
//
//   - Single is the baseline, as Dynamo's KvIndexer: one goroutine owns a
//     radix.Tree and every call, event or query, goes through its channel.
//   - Pool is the thread-pool indexer: lanes of goroutines apply events to a
//     radix.ConcurrentIndex (a CompressedTree unless told otherwise), each
//     worker pinned to one lane so its events stay in order, while queries
//     run on the caller's goroutine.
//
// Both filter storage tiers the same way (only Device-tier events count for
// overlap; others are counted and dropped) and count every rejected event by
// reason, so nothing is lost silently.
package shardpool

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// ErrClosed is returned by every call after Close.
var ErrClosed = errors.New("shardpool: indexer closed")

// Indexer is the contract of every indexer.
type Indexer interface {
	// ApplyEvent queues an event; it blocks while the queue is full. Events
	// of one worker are applied in the order they are queued. It returns an
	// error only after Close: rejections happen asynchronously and are
	// counted in Stats.
	ApplyEvent(ev kvevent.RouterEvent) error
	// FindMatchesForRequest hashes tokens (with the LoRA name) at the
	// indexer's block size, then matches.
	FindMatchesForRequest(tokens []uint32, lora string) (radix.OverlapScores, error)
	// FindMatches matches local block hashes.
	FindMatches(local []uint64) (radix.OverlapScores, error)
	// RemoveWorker queues the removal of every rank of a worker, ordered
	// after the worker's events queued before it.
	RemoveWorker(id kvevent.WorkerID) error
	// Flush returns once every event queued before it has been applied,
	// with the number of events applied since the previous Flush.
	Flush() (int, error)
	// Close applies every queued event, stops the goroutines and waits for
	// them. Calls after Close return ErrClosed.
	Close() error
	// Stats returns the counters.
	Stats() Stats
	// Lanes returns the goroutines applying events: 1 for Single.
	Lanes() int
	// BlockSize returns the tokens per block the indexer hashes requests
	// with: the block size every event it indexes must have been hashed at.
	BlockSize() int
	// Observe makes f hear every event once applied (or rejected), on the
	// goroutine that applied it: for measuring, say, accepted-to-applied
	// latency. Call it before the first event; f must be quick and safe
	// for concurrent use.
	Observe(f func(ev kvevent.RouterEvent, err error))
}

// TierIndexer is an Indexer that reports every tier: a worker's cumulative
// prefix on the device, on the device or the host, and so on
// (radix.TierScores), with shared tiers (radix.TierIndex.SetGroup).
// NewSingleTiers and NewPoolTiers keep every tier; the others answer for
// the device alone (Single) or refuse (Pool).
type TierIndexer interface {
	Indexer
	// KeepsTiers reports whether events of every tier are indexed.
	KeepsTiers() bool
	FindTierMatches(local []uint64) (radix.TierScores, error)
	SetGroup(holder kvevent.Worker, members []kvevent.Worker) error
}

// Stats are an indexer's counters since it started.
type Stats struct {
	Applied        uint64 // events applied without error
	IgnoredTier    uint64 // non-Device events, not indexed (all but NewSingleTiers)
	ParentNotFound uint64 // Stored events rejected: parent unknown
	BlockNotFound  uint64 // Removed events with unknown hashes (rest applied)
	BlocksNotFound uint64 // the unknown hashes in those events
	Invalid        uint64 // events without data
	SelfParent     uint64 // Stored events rejected: a block named itself as its parent
	LastRejection  string // the latest rejection, naming the worker
	QueueDepth     int    // events queued now
	MaxQueueDepth  int    // the deepest any queue has been
	Batches        uint64 // batches drained by the lanes
	BatchedEvents  uint64 // events in those batches
	MaxBatch       int    // the largest batch
	RemovedWorkers uint64 // RemoveWorker calls applied
	Queued         uint64 // Device-tier events ever queued
	Pairs          int    // (worker, block) pairs in the index now
	Unread         uint64 // events sent to an index that reads none (Approx)
}

// Rejected returns the number of events rejected in whole or in part.
func (s Stats) Rejected() uint64 {
	return s.ParentNotFound + s.BlockNotFound + s.Invalid + s.SelfParent
}

// MeanBatch returns the mean batch size.
func (s Stats) MeanBatch() float64 {
	if s.Batches == 0 {
		return 0
	}
	return float64(s.BatchedEvents) / float64(s.Batches)
}

// counters are the shared, concurrently updated part of Stats.
type counters struct {
	applied, ignoredTier, parentNotFound, blockNotFound, blocksNotFound, invalid, selfParent atomic.Uint64
	batches, batchedEvents, removedWorkers, queued                                           atomic.Uint64
	maxBatch, maxDepth, pairs                                                                atomic.Int64
	lastRejection                                                                            atomic.Pointer[string]
	observe                                                                                  func(kvevent.RouterEvent, error) // see Indexer.Observe
}

// done counts the outcome of applying ev and tells the observer.
func (c *counters) done(ev kvevent.RouterEvent, err error) {
	c.record(err)
	if c.observe != nil {
		c.observe(ev, err)
	}
}

// record counts the outcome of applying one event.
func (c *counters) record(err error) {
	if err == nil {
		c.applied.Add(1)
		return
	}
	var missing *radix.MissingBlocksError
	switch {
	case errors.As(err, &missing):
		c.blockNotFound.Add(1)
		c.blocksNotFound.Add(uint64(missing.Missing))
	case errors.Is(err, radix.ErrParentNotFound):
		c.parentNotFound.Add(1)
	case errors.Is(err, radix.ErrInvalidSequence):
		c.selfParent.Add(1)
	default:
		c.invalid.Add(1)
	}
	msg := err.Error()
	c.lastRejection.Store(&msg)
}

func storeMax(m *atomic.Int64, v int64) {
	for {
		old := m.Load()
		if v <= old || m.CompareAndSwap(old, v) {
			return
		}
	}
}

func (c *counters) batch(n int) {
	c.batches.Add(1)
	c.batchedEvents.Add(uint64(n))
	storeMax(&c.maxBatch, int64(n))
}

func (c *counters) stats(depth int) Stats {
	s := Stats{
		Applied:        c.applied.Load(),
		IgnoredTier:    c.ignoredTier.Load(),
		ParentNotFound: c.parentNotFound.Load(),
		BlockNotFound:  c.blockNotFound.Load(),
		BlocksNotFound: c.blocksNotFound.Load(),
		Invalid:        c.invalid.Load(),
		SelfParent:     c.selfParent.Load(),
		QueueDepth:     depth,
		MaxQueueDepth:  int(c.maxDepth.Load()),
		Batches:        c.batches.Load(),
		BatchedEvents:  c.batchedEvents.Load(),
		MaxBatch:       int(c.maxBatch.Load()),
		RemovedWorkers: c.removedWorkers.Load(),
		Queued:         c.queued.Load(),
		Pairs:          int(c.pairs.Load()),
	}
	if p := c.lastRejection.Load(); p != nil {
		s.LastRejection = *p
	}
	return s
}

// gate guards the sending side of an indexer's queues against Close: senders
// hold it shared while they send, Close takes it exclusively, so no send can
// race the closing of a channel, and sends after Close fail cleanly. Its
// zero value is the gate of an indexer not made by its constructor: every
// call fails with ErrNotStarted instead of blocking on a nil channel.
type gate struct {
	mu    sync.RWMutex
	state gateState
}

type gateState uint8

const (
	gateZero gateState = iota
	gateOpen
	gateClosed
)

func (g gateState) err() error {
	if g == gateZero {
		return ErrNotStarted
	}
	return ErrClosed
}

// ErrNotStarted is returned by every call on a zero Single or Pool: use
// NewSingle, NewPool or NewPoolOver.
var ErrNotStarted = errors.New("shardpool: indexer not started (use its constructor)")

// open marks the gate of a started indexer.
func (g *gate) open() { g.state = gateOpen }

// enter returns ErrClosed or ErrNotStarted, or nil with the gate held
// shared; leave releases.
func (g *gate) enter() error {
	g.mu.RLock()
	if g.state != gateOpen {
		g.mu.RUnlock()
		return g.state.err()
	}
	return nil
}

func (g *gate) leave() { g.mu.RUnlock() }

// usable returns the error of a call on an indexer not open, without
// holding the gate.
func (g *gate) usable() error {
	if err := g.enter(); err != nil {
		return err
	}
	g.leave()
	return nil
}

// shut closes an open gate, or returns why it cannot.
func (g *gate) shut() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != gateOpen {
		return g.state.err()
	}
	g.state = gateClosed
	return nil
}

// hasher hashes request tokens with reused buffers.
type hasher struct {
	blockSize int
	bufs      sync.Pool // *[]uint64
}

func newHasher(blockSize int) *hasher {
	h := &hasher{blockSize: blockSize}
	h.bufs.New = func() any { b := make([]uint64, 0, 64); return &b }
	return h
}

// match hashes tokens into a pooled buffer and calls find with it. A block
// size <= 0 is an error here rather than a panic at construction.
func (h *hasher) match(tokens []uint32, lora string, find func([]uint64) (radix.OverlapScores, error)) (radix.OverlapScores, error) {
	if h.blockSize <= 0 {
		return radix.OverlapScores{}, fmt.Errorf("shardpool: block size %d, want > 0", h.blockSize)
	}
	bp := h.bufs.Get().(*[]uint64)
	*bp = hashing.LocalHashes((*bp)[:0], tokens, h.blockSize, hashing.Options{LoRAName: lora})
	res, err := find(*bp)
	h.bufs.Put(bp)
	return res, err
}

// QueueSize is the capacity of each event queue. A full queue blocks the
// sender (back-pressure) rather than dropping events or growing without
// bound: a router that cannot keep up must slow its event sources, never
// silently forget cache state.
const QueueSize = 1 << 14

// MaxBatch bounds how many queued messages a lane drains and applies in one
// go.
const MaxBatch = 256
