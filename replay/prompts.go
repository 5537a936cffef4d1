package replay

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/trace"
)

// prompts is a trace's prompts hashed once at the replay's block size: for
// each request, its local (tokens) hashes and sequence hashes of the
// complete blocks, and its length in tokens. A comparison or a sweep hashes
// the trace once and shares it, read only, with every router, engine and
// reference cache it runs; a replay used to expand and hash every prompt
// twice per run (engines and router).
//
// Hashing runs in the background, in request order, ahead of the
// simulations that read it: a simulation's arrival waits for its request
// (wait), which is hashed long before on the trace (hashing takes a fifth
// of a replay), so hashing is off the replay's critical path. The owner
// starts it (startPrompts) and must close it.
type prompts struct {
	local, seq [][]uint64
	tokens     []int // the prompt's tokens, as trace.TokensOf expands it
	blockSize  int
	traceBlock int

	ready  atomic.Int64 // requests 0..ready-1 are hashed
	mu     sync.Mutex
	cond   sync.Cond // broadcast as ready grows, and at the end
	err    error     // why hashing stopped early; under mu
	cancel context.CancelFunc
	done   chan struct{}
}

// hashBatch is how many requests hashing publishes at a time.
const hashBatch = 64

// startPrompts starts hashing every request of reqs for cfg's block sizes.
func startPrompts(ctx context.Context, reqs []trace.Request, cfg Config) *prompts {
	p := &prompts{
		local: make([][]uint64, len(reqs)), seq: make([][]uint64, len(reqs)), tokens: make([]int, len(reqs)),
		blockSize: cfg.BlockSize, traceBlock: cfg.TraceBlockSize, done: make(chan struct{}),
	}
	p.cond.L = &p.mu
	ctx, p.cancel = context.WithCancel(ctx)
	go p.hash(ctx, reqs)
	return p
}

// hash hashes the requests in order, cutting their hashes from shared
// backing arrays, and publishes them hashBatch at a time.
func (p *prompts) hash(ctx context.Context, reqs []trace.Request) {
	defer close(p.done)
	var toks []uint32
	var local, seq []uint64
	for i := range reqs {
		if i%hashBatch == 0 {
			p.publish(i, ctx.Err())
			if ctx.Err() != nil {
				return
			}
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
	p.publish(len(reqs), nil)
}

// publish makes requests 0..n-1 readable, or records why hashing stops.
func (p *prompts) publish(n int, err error) {
	p.mu.Lock()
	if err != nil {
		p.err = err
	} else {
		p.ready.Store(int64(n))
	}
	p.mu.Unlock()
	p.cond.Broadcast()
}

// wait returns once request i is hashed, or the error that stopped
// hashing first.
func (p *prompts) wait(i int) error {
	if int64(i) < p.ready.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for int64(i) >= p.ready.Load() && p.err == nil {
		p.cond.Wait()
	}
	if int64(i) < p.ready.Load() {
		return nil
	}
	return p.err
}

// waitAll is wait for every request.
func (p *prompts) waitAll() error { return p.wait(len(p.local) - 1) }

// close stops hashing and waits for it.
func (p *prompts) close() {
	p.cancel()
	<-p.done
}

// fits reports whether p was hashed for cfg's block sizes.
func (p *prompts) fits(cfg Config) bool {
	return p.blockSize == cfg.BlockSize && p.traceBlock == cfg.TraceBlockSize
}
