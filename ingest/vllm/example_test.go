package vllm_test

import (
	"fmt"
	"time"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/kvevent"
	"github.com/kvradix/kvradix/shardpool"
)

// A Subscriber takes an engine's KV events off its ZeroMQ socket into an
// indexer. Here the engine is kvradix's own vLLM-compatible publisher; a
// vLLM engine started with --kv-events-config publishes the same way.
func ExampleSubscriber() {
	engine, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer engine.Close()
	pool := shardpool.NewPool(2, 16)
	defer pool.Close()
	sub, err := vllm.NewSubscriber(pool, vllm.SubscriberConfig{BlockSize: 16},
		vllm.Endpoint{Worker: 7, Address: engine.Addr(), Replay: engine.ReplayAddr()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sub.Close()

	prompt := make([]uint32, 48) // three blocks of 16 tokens
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	stored := vllm.Event{Type: "BlockStored", BlockHashes: []uint64{101, 102, 103}, TokenIDs: prompt, BlockSize: 16}
	if _, err := engine.Publish([]vllm.Event{stored}); err != nil {
		fmt.Println(err)
		return
	}
	// PUB/SUB drops what is sent before the subscription reaches the
	// engine: the engine's next batch shows the subscriber the gap, which it
	// fills from the engine's replay socket.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err := sub.Flush(); err != nil {
			fmt.Println(err)
			return
		}
		res, err := pool.FindMatchesForRequest(prompt, "")
		if err != nil {
			fmt.Println(err)
			return
		}
		if n := res.Scores[kvevent.Worker{ID: 7}]; n > 0 {
			fmt.Printf("worker 7 caches %d blocks of the prompt\n", n)
			return
		}
		if _, err := engine.Publish(nil); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println("the events never arrived")
	// Output: worker 7 caches 3 blocks of the prompt
}
