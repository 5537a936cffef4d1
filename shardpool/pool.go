package shardpool

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/radix"
)

// Pool is the thread-pool indexer over a radix.ConcurrentIndex: by default
// a radix.CompressedTree, or any concurrent index given to NewPoolOver.
//
//   - Each worker id belongs to lane id mod lanes, so one worker's events,
//     and its removal, apply in order, and each lane alone touches its
//     workers' engine-hash maps. The assignment is a function, not a table:
//     nothing is remembered of a worker that left.
//   - A lane drains its queue in batches of up to MaxBatch and applies each
//     run of events in a batch with one ApplyBatch: the CompressedTree takes
//     its shared lock once for it, and locks only the runs an event walks,
//     so lanes write in parallel.
//   - FindMatches runs on the caller's goroutine against the concurrent
//     index: queries never queue behind events and scale with readers. A
//     query sees the events applied so far, not necessarily all queued.
//   - Back-pressure: each lane's queue holds QueueSize messages; a full
//     queue blocks the sender. No event is ever dropped.
//   - Flush is a barrier across every lane; Close drains every queue.
//
// All methods are safe for concurrent use.
type Pool struct {
	h      *hasher
	tree   radix.ConcurrentIndex
	tiers  radix.TierIndex // the tree, if it keeps tiers (NewPoolTiers)
	lanes  []chan laneMsg
	state  []laneState
	gate   gate
	closed atomic.Bool
	wg     sync.WaitGroup
	c      counters
}

// laneState lets Flush skip lanes with nothing pending: a lane whose done
// count has reached the sent count read before it has applied everything
// sent before the Flush (a lane is FIFO). On a cache line of its own.
type laneState struct {
	sent    atomic.Int64 // events and removals sent to the lane
	done    atomic.Int64 // of those, applied
	applied atomic.Int64 // events applied since the last Flush
	_       [64 - 24]byte
}

// MaxLanes bounds a pool's lanes: each is a goroutine with a queue of
// QueueSize batches, and past the cores of any machine more lanes only
// add queues.
const MaxLanes = 256

// NewPool starts a pool of lanes goroutines (1 to MaxLanes) for the block
// size over a radix.CompressedTree, the faster index (results/README.md).
func NewPool(lanes, blockSize int) *Pool {
	return NewPoolOver(lanes, blockSize, radix.NewCompressedTree())
}

// NewPoolOver starts a pool of lanes goroutines (lanes floored at 1 and
// capped at MaxLanes) for the block size over idx, which it owns from then
// on.
func NewPoolOver(lanes, blockSize int, idx radix.ConcurrentIndex) *Pool {
	lanes = min(max(lanes, 1), MaxLanes)
	p := &Pool{
		h:     newHasher(blockSize),
		tree:  idx,
		lanes: make([]chan laneMsg, lanes),
		state: make([]laneState, lanes),
	}
	p.gate.open()
	for i := range p.lanes {
		p.lanes[i] = make(chan laneMsg, QueueSize)
		p.wg.Add(1)
		go p.run(p.lanes[i], &p.state[i])
	}
	return p
}

// NewPoolTiers is NewPool keeping every tier: events of the host, disk
// and external tiers are indexed too, and FindTierMatches reports each
// worker's cumulative prefix per tier.
func NewPoolTiers(lanes, blockSize int) *Pool {
	return NewPoolTiersOver(lanes, blockSize, radix.NewCompressedTree())
}

// NewPoolTiersOver is NewPoolOver keeping every tier, over an index that
// keeps them.
func NewPoolTiersOver(lanes, blockSize int, idx interface {
	radix.ConcurrentIndex
	radix.TierIndex
}) *Pool {
	p := NewPoolOver(lanes, blockSize, idx)
	p.tiers = idx
	return p
}

var (
	_ Indexer     = (*Pool)(nil)
	_ TierIndexer = (*Pool)(nil)
)

// errNoTiers is a tier call's error on an indexer that keeps the device
// tier only.
var errNoTiers = errors.New("shardpool: this indexer keeps the device tier only (NewPoolTiers, NewSingleTiers keep every tier)")

// KeepsTiers implements TierIndexer.
func (p *Pool) KeepsTiers() bool { return p.tiers != nil }

// FindTierMatches implements TierIndexer; it runs on the caller's
// goroutine.
func (p *Pool) FindTierMatches(local []uint64) (radix.TierScores, error) {
	if p.tiers == nil {
		return radix.TierScores{}, errNoTiers
	}
	if p.closed.Load() {
		return radix.TierScores{}, p.gate.usable()
	}
	return p.tiers.FindTierMatches(local), nil
}

// SetGroup implements TierIndexer (at once, not in order with the events
// queued).
func (p *Pool) SetGroup(holder kvevent.Worker, members []kvevent.Worker) error {
	if p.tiers == nil {
		return errNoTiers
	}
	if err := p.gate.usable(); err != nil {
		return err
	}
	p.tiers.SetGroup(holder, members)
	return nil
}

// Lanes returns the number of lanes.
func (p *Pool) Lanes() int { return len(p.lanes) }

// BlockSize implements Indexer.
func (p *Pool) BlockSize() int { return p.h.blockSize }

// Index returns the index the pool maintains, for reading only (FindMatches,
// Size; Dump once the pool is flushed and idle).
func (p *Pool) Index() radix.ConcurrentIndex { return p.tree }

// laneMsg is a message to a pool's lane: an event, the removal of a
// worker (ev.WorkerID) or a flush (reply). It is 64 bytes where Single's
// msg is 136: each lane's queue holds QueueSize of them, made with the
// pool, most of an empty index's heap.
type laneMsg struct {
	kind  msgKind
	ev    kvevent.RouterEvent
	reply chan result
}

// lane returns the queue of a worker id, and its state.
func (p *Pool) lane(id kvevent.WorkerID) (chan laneMsg, *laneState) {
	i := uint64(id) % uint64(len(p.lanes))
	return p.lanes[i], &p.state[i]
}

func (p *Pool) run(ch chan laneMsg, st *laneState) {
	defer p.wg.Done()
	batch := make([]laneMsg, 0, MaxBatch)
	evs, errs := make([]kvevent.RouterEvent, 0, MaxBatch), make([]error, MaxBatch)
	for open := true; open; {
		m, ok := <-ch
		if !ok {
			return
		}
		batch = append(batch[:0], m)
	drain:
		for len(batch) < MaxBatch {
			select {
			case m, ok := <-ch:
				if !ok {
					open = false
					break drain
				}
				batch = append(batch, m)
			default:
				break drain
			}
		}
		p.c.batch(len(batch))
		for i := 0; i < len(batch); i++ {
			m := &batch[i]
			switch m.kind {
			case msgEvent:
				n := p.applyEvents(batch[i:], &evs, &errs)
				st.applied.Add(int64(n))
				st.done.Add(int64(n))
				i += n - 1
			case msgRemove:
				p.tree.RemoveWorker(m.ev.WorkerID)
				p.c.removedWorkers.Add(1)
				st.done.Add(1)
			case msgFlush:
				m.reply <- result{n: int(st.applied.Swap(0))}
			}
			*m = laneMsg{} // drop references for the GC
		}
	}
}

// applyEvents applies the events at the head of ms, up to the first message
// of another kind, in one ApplyBatch, counts them, clears their messages
// and returns how many there were.
func (p *Pool) applyEvents(ms []laneMsg, evs *[]kvevent.RouterEvent, errs *[]error) int {
	n := 0
	for n < len(ms) && ms[n].kind == msgEvent {
		n++
	}
	es := (*evs)[:0]
	for i := range n {
		es = append(es, ms[i].ev)
	}
	p.tree.ApplyBatch(es, *errs)
	for i := range n {
		p.c.done(es[i], (*errs)[i])
		ms[i], (*errs)[i] = laneMsg{}, nil
	}
	clear(es) // drop references for the GC
	*evs = es[:0]
	return n
}

// ApplyEvent implements Indexer.
func (p *Pool) ApplyEvent(ev kvevent.RouterEvent) error {
	if err := p.gate.enter(); err != nil {
		return err
	}
	defer p.gate.leave()
	if !ev.Tier.IsGPU() && p.tiers == nil {
		p.c.ignoredTier.Add(1)
		return nil
	}
	ch, st := p.lane(ev.WorkerID)
	st.sent.Add(1)
	ch <- laneMsg{kind: msgEvent, ev: ev}
	p.c.queued.Add(1)
	storeMax(&p.c.maxDepth, int64(len(ch)))
	return nil
}

// FindMatches implements Indexer; it runs on the caller's goroutine.
func (p *Pool) FindMatches(local []uint64) (radix.OverlapScores, error) {
	if p.closed.Load() || p.tree == nil {
		return radix.OverlapScores{}, p.gate.usable()
	}
	return p.tree.FindMatches(local, false), nil
}

// matchAppender is an index that matches without allocating
// (CompressedTree).
type matchAppender interface {
	AppendMatches(dst []radix.Match, local []uint64, earlyExit bool) []radix.Match
}

// AppendMatches appends to dst the match of every worker holding at least
// the first of local (in no particular order), on the caller's goroutine:
// FindMatches without the maps. It allocates nothing where the index has
// an AppendMatches of its own (CompressedTree); over another index it
// converts FindMatches' answer.
func (p *Pool) AppendMatches(dst []radix.Match, local []uint64) ([]radix.Match, error) {
	if p.closed.Load() || p.tree == nil {
		return dst, p.gate.usable()
	}
	if a, ok := p.tree.(matchAppender); ok {
		return a.AppendMatches(dst, local, false), nil
	}
	res := p.tree.FindMatches(local, false)
	for w, score := range res.Scores {
		dst = append(dst, radix.Match{Worker: w, Score: score, TreeSize: res.TreeSizes[w]})
	}
	return dst, nil
}

// FindMatchesForRequest implements Indexer.
func (p *Pool) FindMatchesForRequest(tokens []uint32, lora string) (radix.OverlapScores, error) {
	if err := p.gate.usable(); err != nil {
		return radix.OverlapScores{}, err
	}
	return p.h.match(tokens, lora, p.FindMatches)
}

// RemoveWorker implements Indexer: the removal goes through the worker's
// lane, after its queued events.
func (p *Pool) RemoveWorker(id kvevent.WorkerID) error {
	if err := p.gate.enter(); err != nil {
		return err
	}
	defer p.gate.leave()
	ch, st := p.lane(id)
	st.sent.Add(1)
	ch <- laneMsg{kind: msgRemove, ev: kvevent.RouterEvent{WorkerID: id}}
	return nil
}

// Flush implements Indexer: a barrier message through every lane that
// has anything pending; a lane that has applied all it was sent is read
// without a message (a replay flushes before every routing decision).
func (p *Pool) Flush() (int, error) {
	if err := p.gate.enter(); err != nil {
		return 0, err
	}
	var reply chan result
	n, waiting := 0, 0
	for i, ch := range p.lanes {
		st := &p.state[i]
		if st.done.Load() >= st.sent.Load() {
			n += int(st.applied.Swap(0))
			continue
		}
		if reply == nil {
			reply = make(chan result, len(p.lanes))
		}
		ch <- laneMsg{kind: msgFlush, reply: reply}
		waiting++
	}
	p.gate.leave()
	for range waiting {
		n += (<-reply).n
	}
	return n, nil
}

// Close implements Indexer.
func (p *Pool) Close() error {
	if err := p.gate.shut(); err != nil {
		return err
	}
	p.closed.Store(true)
	for _, ch := range p.lanes {
		close(ch)
	}
	p.wg.Wait()
	return nil
}

// Stats implements Indexer.
func (p *Pool) Stats() Stats {
	depth := 0
	for _, ch := range p.lanes {
		depth += len(ch)
	}
	st := p.c.stats(depth)
	if p.tree != nil {
		st.Pairs = p.tree.Size()
	}
	return st
}

// Observe implements Indexer.
func (p *Pool) Observe(f func(ev kvevent.RouterEvent, err error)) { p.c.observe = f }
