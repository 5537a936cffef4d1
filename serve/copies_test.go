package serve_test

import (
	"net/http/httptest"
	"testing"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/serve"
)

// vLLM keeps duplicate copies of a block and removes each on its own: an
// engine that stored a block twice and evicted one copy still holds it,
// and the service still answers it there; the second eviction drops it.
func TestDuplicateCopiesThroughTheService(t *testing.T) {
	svc := serve.New(serve.Config{})
	defer svc.Close()
	ts := httptest.NewServer(svc.Handler())
	defer ts.Close()
	pub := registerPublishers(t, svc, 1)[0]
	prompt := tokens(2*bs, 300)
	stored := vllm.Event{Type: vllm.BlockStored, BlockHashes: []uint64{41, 42}, TokenIDs: prompt, BlockSize: bs, Medium: "GPU"}
	removed := vllm.Event{Type: vllm.BlockRemoved, BlockHashes: []uint64{42}, Medium: "GPU"}
	held := func() uint64 {
		var got serve.Scores
		post(t, ts.URL+"/query", serve.Query{TokenIDs: prompt, ModelName: "m"}, &got)
		return got.Scores["1"]["0"]
	}
	publish := func(ev vllm.Event) {
		if _, err := pub.Publish([]vllm.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	publish(stored)
	publish(stored) // a second copy of both blocks
	publish(removed)
	// The subscription connects asynchronously, and PUB/SUB drops what is
	// sent before it joins: the subscriber replays it at once, unless it
	// was sent after that replay and before the subscription reached the
	// engine; then the next batch shows the gap, which it repairs.
	testwait.For(t, "the first removal kept", func() bool {
		nudge(t, pub)
		return metric(t, ts.URL, `kvradix_subscriber_copies_kept_total{dp_rank="0",instance="1",model="m:default"}`) == 1
	})
	if n := held(); n != 2*bs {
		t.Fatalf("after one copy of block 42 went: %d tokens held, want %d", n, 2*bs)
	}
	publish(removed)
	testwait.For(t, "the last copy's removal applied", func() bool { return held() == bs })
}
