package replay

import (
	"cmp"
	"context"
	"slices"

	"github.com/kvradix/kvradix/router"
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
	p := startPrompts(ctx, reqs, cfg)
	defer p.close()
	return references(ctx, reqs, p, cfg)
}

// references computes both references over prompts hashed once. Each
// distinct block (sequence hash) is interned once to a dense id, so that
// the caches are arrays: a pooled LRU of prev/next links, and for the
// unbounded cache (an LRU that never evicts) one bit a block.
func references(ctx context.Context, reqs []trace.Request, p *prompts, cfg Config) (pooled, unbounded float64, err error) {
	if err := p.waitAll(); err != nil {
		return 0, 0, err
	}
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].Timestamp, reqs[b].Timestamp) })
	ids, distinct := intern(p, order)
	pc := newLRU(cfg.engines()*cfg.Blocks, distinct)
	seen := make([]bool, distinct)
	var prompt, pooledHits, unboundedHits int64
	var blocks []int32
	for n, i := range order {
		if n%256 == 0 && ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		tr := reqs[i]
		if router.BlocksFor(tr.InputLength, tr.OutputLength, cfg.BlockSize) > cfg.Blocks {
			continue
		}
		blocks = ids(blocks[:0], i)
		limit := (tr.InputLength - 1) / cfg.BlockSize
		prompt += int64(tr.InputLength)
		pooledHits += int64(min(pc.use(blocks), limit))
		unboundedHits += int64(min(useUnbounded(seen, blocks), limit))
	}
	if prompt == 0 {
		return 0, 0, nil
	}
	bs := float64(cfg.BlockSize)
	return float64(pooledHits) * bs / float64(prompt), float64(unboundedHits) * bs / float64(prompt), nil
}

// intern numbers the distinct sequence hashes of the requests in order
// from 0, and returns a function appending request i's block ids to dst,
// with the number of distinct blocks. Its table is open addressing over a
// power of two at least 1.5 times the blocks, hash and id in one slot (a Go map took
// twice as long, and keys and ids in separate arrays two misses a probe).
func intern(p *prompts, order []int) (func(dst []int32, i int) []int32, int) {
	start := make([]int, len(p.seq)+1) // request i's ids are all[start[i]:start[i+1]]
	for i, s := range p.seq {
		start[i+1] = start[i] + len(s)
	}
	all := make([]int32, start[len(p.seq)])
	size := 1
	for size < len(all)+len(all)/2 {
		size <<= 1
	}
	type slot struct {
		h  uint64
		id int32 // id + 1; 0: empty
	}
	table := make([]slot, size) // one cache line a probe: hash and id side by side
	distinct := int32(0)
	for _, i := range order {
		for j, h := range p.seq[i] {
			k := int(h * 0x9E3779B97F4A7C15 >> 32 & uint64(size-1))
			for table[k].id != 0 && table[k].h != h {
				k = (k + 1) & (size - 1)
			}
			if table[k].id == 0 {
				distinct++
				table[k] = slot{h, distinct}
			}
			all[start[i]+j] = table[k].id - 1
		}
	}
	return func(dst []int32, i int) []int32 { return append(dst, all[start[i]:start[i+1]]...) }, int(distinct)
}

// useUnbounded is lru.use for a cache without a capacity: how many leading
// blocks were seen before, then every block is.
func useUnbounded(seen []bool, blocks []int32) int {
	hits := 0
	for hits < len(blocks) && seen[blocks[hits]] {
		hits++
	}
	for _, b := range blocks {
		seen[b] = true
	}
	return hits
}

// lru is a prefix cache of dense block ids with least-recently-used
// eviction: a doubly linked list through arrays indexed by id, the
// sentinel at index n (n = the number of distinct ids).
type lru struct {
	capacity, len int
	prev, next    []int32
	in            []bool
}

func newLRU(capacity, n int) *lru {
	c := &lru{capacity: capacity, prev: make([]int32, n+1), next: make([]int32, n+1), in: make([]bool, n)}
	c.prev[n], c.next[n] = int32(n), int32(n)
	return c
}

// use returns how many leading blocks are cached, then makes every block
// the most recently used, the first block last (as an engine frees a
// request's tail before its prefix, so the prefix is evicted last).
func (c *lru) use(blocks []int32) int {
	hits := 0
	for hits < len(blocks) && c.in[blocks[hits]] {
		hits++
	}
	head := int32(len(c.in))
	for j := len(blocks) - 1; j >= 0; j-- {
		b := blocks[j]
		if c.in[b] {
			c.next[c.prev[b]], c.prev[c.next[b]] = c.next[b], c.prev[b]
		} else {
			c.in[b] = true
			c.len++
		}
		c.prev[b], c.next[b] = c.prev[head], head
		c.next[c.prev[head]] = b
		c.prev[head] = b
	}
	for c.len > c.capacity {
		old := c.next[head]
		c.next[c.prev[old]], c.prev[c.next[old]] = c.next[old], c.prev[old]
		c.in[old] = false
		c.len--
	}
	return hits
}
