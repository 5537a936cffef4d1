package serve_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/serve"
)

// The service embedded in a Go program: an engine registered with its
// ZeroMQ endpoint, its events indexed, and a prompt queried over HTTP as
// Dynamo's standalone indexer answers it (`kvradix serve` runs the same).
func ExampleService() {
	svc := serve.New(serve.Config{Lanes: 2})
	defer svc.Close()
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()

	engine, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer engine.Close()
	reg := serve.Registration{InstanceID: 3, Endpoint: engine.Addr(), ReplayEndpoint: engine.ReplayAddr(), ModelName: "m", BlockSize: 16}
	if err := svc.Register(reg); err != nil { // or POST /register with this body
		fmt.Println(err)
		return
	}

	prompt := make([]uint32, 64) // four blocks of 16 tokens
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	stored := vllm.Event{Type: "BlockStored", BlockHashes: []uint64{1, 2, 3, 4}, TokenIDs: prompt, BlockSize: 16}
	if _, err := engine.Publish([]vllm.Event{stored}); err != nil {
		fmt.Println(err)
		return
	}
	query, _ := json.Marshal(serve.Query{TokenIDs: prompt, ModelName: "m"})
	// The subscription connects asynchronously: the engine's next batch
	// shows the service the first, which it repairs from the replay socket.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := http.Post(srv.URL+"/query", "application/json", bytes.NewReader(query))
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var answer serve.Scores
		if err := json.Unmarshal(body, &answer); err != nil {
			fmt.Println(resp.Status, err)
			return
		}
		if n := answer.Scores["3"]["0"]; n > 0 { // instance, rank: matched tokens, as Dynamo's answer
			fmt.Printf("instance 3, rank 0: %d tokens of the prompt cached\n", n)
			return
		}
		if _, err := engine.Publish(nil); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println("the events never arrived")
	// Output: instance 3, rank 0: 64 tokens of the prompt cached
}
