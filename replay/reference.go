package replay

import (
	"cmp"
	"context"
	"math"
	"slices"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/trace"
)

// References returns the reuse a routing can be measured against, on the
// same trace and fleet as Run:
//
//   - pooled: one LRU prefix cache holding the whole fleet's blocks
//     (Workers × DPSize engines × Blocks, same block size), fed every request in arrival
//     order. No router over separate caches can expect more: every router
//     places each block in one engine's share of the same capacity.
//   - unbounded: the same cache without a capacity, the trace's own reuse
//     ceiling.
//
// Both count reuse as Run does: the leading complete prompt blocks found
// cached, leaving at least one prompt token to compute, over the prompt
// tokens of the requests an engine can hold (larger ones are skipped, as Run
// rejects them). The reference caches are not occupied by running requests;
// that makes them an upper bound, not a simulation.
func References(reqs []trace.Request, cfg Config) (pooled, unbounded float64, err error) {
	return ReferencesContext(context.Background(), reqs, cfg)
}

// ReferencesContext is References, returning ctx's error soon after ctx
// ends.
func ReferencesContext(ctx context.Context, reqs []trace.Request, cfg Config) (pooled, unbounded float64, err error) {
	if err := cfg.Validate(); err != nil {
		return 0, 0, err
	}
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].Timestamp, reqs[b].Timestamp) })
	pc, uc := newLRU(cfg.engines()*cfg.Blocks), newLRU(math.MaxInt)
	var tokens []uint32
	var local, seq []uint64
	var prompt, pooledHits, unboundedHits int64
	for n, i := range order {
		if n%256 == 0 && ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		tr := reqs[i]
		if blocksFor(tr.InputLength, tr.OutputLength, cfg.BlockSize) > cfg.Blocks {
			continue
		}
		tokens = trace.TokensOf(tokens[:0], tr, cfg.TraceBlockSize)
		local = hashing.LocalHashes(local[:0], tokens, cfg.BlockSize, hashing.Options{})
		seq = hashing.SequenceHashes(seq[:0], local)
		limit := (tr.InputLength - 1) / cfg.BlockSize
		prompt += int64(tr.InputLength)
		pooledHits += int64(min(pc.use(seq), limit))
		unboundedHits += int64(min(uc.use(seq), limit))
	}
	if prompt == 0 {
		return 0, 0, nil
	}
	bs := float64(cfg.BlockSize)
	return float64(pooledHits) * bs / float64(prompt), float64(unboundedHits) * bs / float64(prompt), nil
}

// lru is a prefix cache of block hashes with least-recently-used eviction.
type lru struct {
	capacity int
	nodes    map[uint64]*lruNode
	head     lruNode // sentinel: head.next is the least recently used
}

type lruNode struct {
	hash       uint64
	prev, next *lruNode
}

func newLRU(capacity int) *lru {
	c := &lru{capacity: capacity, nodes: map[uint64]*lruNode{}}
	c.head.prev, c.head.next = &c.head, &c.head
	return c
}

// use returns how many leading blocks of seq are cached, then makes every
// block of seq the most recently used, the first block last (as an engine
// frees a request's tail before its prefix, so the prefix is evicted last).
func (c *lru) use(seq []uint64) int {
	hits := 0
	for hits < len(seq) && c.nodes[seq[hits]] != nil {
		hits++
	}
	for j := len(seq) - 1; j >= 0; j-- {
		n := c.nodes[seq[j]]
		if n != nil {
			n.prev.next, n.next.prev = n.next, n.prev
		} else {
			n = &lruNode{hash: seq[j]}
			c.nodes[n.hash] = n
		}
		n.prev, n.next = c.head.prev, &c.head
		c.head.prev.next = n
		c.head.prev = n
	}
	for len(c.nodes) > c.capacity {
		old := c.head.next
		old.prev.next, old.next.prev = old.next, old.prev
		delete(c.nodes, old.hash)
	}
	return hits
}
