package replay

import (
	"context"
	"runtime"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/trace"
)

// prompts is a trace's prompts hashed once at the replay's block size: for
// each request, its local (tokens) hashes and sequence hashes of the
// complete blocks, and its length in tokens. A comparison or a sweep hashes
// the trace once and shares it, read only, with every router, engine and
// reference cache it runs; a replay used to expand and hash every prompt
// twice per run (engines and router).
type prompts struct {
	local, seq [][]uint64
	tokens     []int // the prompt's tokens, as trace.TokensOf expands it
	blockSize  int
	traceBlock int
}

// hashPrompts hashes every request of reqs for cfg's block sizes, in
// GOMAXPROCS shards of consecutive requests at once.
func hashPrompts(ctx context.Context, reqs []trace.Request, cfg Config) (*prompts, error) {
	p := &prompts{
		local: make([][]uint64, len(reqs)), seq: make([][]uint64, len(reqs)), tokens: make([]int, len(reqs)),
		blockSize: cfg.BlockSize, traceBlock: cfg.TraceBlockSize,
	}
	shards := max(1, min(runtime.GOMAXPROCS(0), len(reqs)/64))
	jobs := make([]func() error, shards)
	for k := range jobs {
		lo, hi := k*len(reqs)/shards, (k+1)*len(reqs)/shards
		jobs[k] = func() error { return p.hash(ctx, reqs, lo, hi) }
	}
	if err := parallel(jobs, shards, nil); err != nil {
		return nil, err
	}
	return p, nil
}

// hash hashes requests lo..hi-1, cutting their hashes from shared backing
// arrays.
func (p *prompts) hash(ctx context.Context, reqs []trace.Request, lo, hi int) error {
	var toks []uint32
	var local, seq []uint64
	for i := lo; i < hi; i++ {
		if i%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		toks = trace.TokensOf(toks[:0], reqs[i], p.traceBlock)
		p.tokens[i] = len(toks)
		n := len(toks) / p.blockSize
		if cap(local)-len(local) < n {
			local = make([]uint64, 0, max(n, 1<<16))
			seq = make([]uint64, 0, max(n, 1<<16))
		}
		start := len(local)
		local = hashing.LocalHashes(local, toks, p.blockSize, hashing.Options{})
		seq = hashing.SequenceHashes(seq, local[start:])
		p.local[i], p.seq[i] = local[start:len(local):len(local)], seq[start:len(seq):len(seq)]
	}
	return nil
}

// fits reports whether p was hashed for cfg's block sizes.
func (p *prompts) fits(cfg Config) bool {
	return p.blockSize == cfg.BlockSize && p.traceBlock == cfg.TraceBlockSize
}
