package main

import (
	"container/list"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/trace"
)

// traceEngine is a vLLM engine with prefix caching serving its share of
// the trace, as `loadgen serve`'s publishers: a request stores the
// blocks it does not lead with (one BlockStored, token ids included,
// under the last block of the prefix it holds), and blocks past the
// engine's capacity leave least recently used first (one BlockRemoved).
// Engine hashes chain the trace's hash ids, so engines serving requests
// with a common prefix name its blocks alike, as vLLM's do. It is not
// safe for concurrent use.
type traceEngine struct {
	blockSize, capacity int
	lru                 list.List // of engine hashes, most recent first
	at                  map[uint64]*list.Element
	tokens              []uint32
}

func newTraceEngine(blockSize, capacity int) *traceEngine {
	return &traceEngine{blockSize: blockSize, capacity: capacity, at: map[uint64]*list.Element{}}
}

// serve returns the events of serving req (a request as trace.Stretch
// returns it for the engine's block size).
func (e *traceEngine) serve(req trace.Request) []vllm.Event {
	e.tokens = trace.TokensOf(e.tokens[:0], req, e.blockSize)
	n := len(e.tokens) / e.blockSize // complete blocks only
	hashes := make([]uint64, n)
	for i := range n {
		parent := uint64(0)
		if i > 0 {
			parent = hashes[i-1]
		}
		hashes[i] = hashing.Chain(parent, req.HashIDs[i])
	}
	hit := 0
	for hit < n && e.at[hashes[hit]] != nil {
		hit++
	}
	for _, h := range hashes {
		if el := e.at[h]; el != nil {
			e.lru.MoveToFront(el)
		} else {
			e.at[h] = e.lru.PushFront(h)
		}
	}
	var evs []vllm.Event
	if hit < n {
		st := vllm.Event{Type: vllm.BlockStored, BlockHashes: hashes[hit:], TokenIDs: append([]uint32(nil), e.tokens[hit*e.blockSize:n*e.blockSize]...),
			BlockSize: e.blockSize, Medium: "GPU", KVCacheSpecKind: "full_attention"}
		if hit > 0 {
			st.ParentBlockHash = &hashes[hit-1]
		}
		evs = append(evs, st)
	}
	var gone []uint64
	for e.lru.Len() > e.capacity {
		h := e.lru.Remove(e.lru.Back()).(uint64)
		delete(e.at, h)
		gone = append(gone, h)
	}
	if len(gone) > 0 {
		evs = append(evs, vllm.Event{Type: vllm.BlockRemoved, BlockHashes: gone, Medium: "GPU"})
	}
	return evs
}
