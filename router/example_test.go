package router_test

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/kvradix/kvradix/hashing"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/router"
)

// A KV router sends a request to the worker caching the longest prefix of
// its prompt, and tracks it until it completes.
func ExampleRouter() {
	r, err := router.New(router.KV, router.DefaultConfig(), 3)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Shutdown()

	prompt := make([]uint32, 256) // 16 blocks of 16 tokens
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	// Worker 2 served the prompt before and publishes the blocks it cached.
	local := hashing.LocalHashes(nil, prompt, 16, hashing.Options{})
	var blocks []kvevent.StoredBlock
	for i, seq := range hashing.SequenceHashes(nil, local) {
		blocks = append(blocks, kvevent.StoredBlock{BlockHash: seq, TokensHash: local[i]})
	}
	if err := r.Sink(2).Publish(kvevent.Event{ID: 1, Data: kvevent.Stored{Blocks: blocks}}); err != nil {
		fmt.Println(err)
		return
	}
	if err := r.Flush(); err != nil { // events apply asynchronously
		fmt.Println(err)
		return
	}

	req := router.Request{UUID: uuid.New(), Tokens: append(prompt, 1, 2, 3), MaxOutputTokens: 64}
	w, err := r.SelectWorker(context.Background(), req)
	fmt.Println("routed to worker", w, err)
	freed, err := r.OnComplete(req.UUID) // its blocks leave the worker's load
	fmt.Println("freed:", freed, err)
	// Output:
	// routed to worker 2 <nil>
	// freed: true <nil>
}
